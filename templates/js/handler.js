// The handler of {{name}}: called once per delivery, returns its outcome.
import { handler, ack, log } from 'wharf';

export const handle = handler((d) => {
  log.info(`attempt ${d.attempt} of ${JSON.stringify(d.text ?? '<binary>')}`);
  // To publish a message if this delivery is acked (import `send` from
  // 'wharf'; the mount must grant the address, see wharf.toml; a refusal
  // throws a SendError whose `code` says why):
  //   send('{{name}}.out', { body: d.body, subject: 'processed' });
  return ack();
});
