// The handler of {{name}}: called once per delivery, returns its outcome.
import { handler, ack, log } from 'wharf';

export const handle = handler((d) => {
  log.info(`attempt ${d.attempt} of ${JSON.stringify(d.text ?? '<binary>')}`);
  return ack();
});
