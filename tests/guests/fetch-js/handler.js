// Fetches the URL in the delivery's `url` property with `fetch` (the `http`
// grant): acks when the answer is 2xx with the delivery's body, drops when
// the host denies the request (a TypeError), retries otherwise.
import { handler, ack, drop, retry, log } from 'wharf';

export const handle = handler(async (d) => {
  const url = d.property('url');
  let answer;
  try {
    answer = await fetch(url);
  } catch (e) {
    log.warn(`${url}: ${e}`);
    return e instanceof TypeError ? drop() : retry();
  }
  const text = await answer.text();
  if (answer.ok && text === d.text) return ack();
  log.warn(`${url}: ${answer.status} ${text}`);
  return retry();
});
