// Decides by the body: `retry` retries at once, `later` retries after a delay
// (the application property `delay-ms`, default 1000), `bad` is dropped,
// anything else is acknowledged.
import { handler, ack, retry, retryAfter, drop, log } from 'wharf';

export const handle = handler((d) => {
  const body = d.text;
  let outcome;
  switch (body) {
    case 'retry':
      outcome = retry();
      break;
    case 'later':
      outcome = retryAfter(delayMs(d));
      break;
    case 'bad':
      outcome = drop();
      break;
    default:
      outcome = ack();
  }
  log.info(`attempt ${d.attempt} of ${JSON.stringify(body ?? '<binary>')}: ${describe(outcome)}`);
  return outcome;
});

/** @param {import('wharf').Delivery} d */
function delayMs(d) {
  const value = d.property('delay-ms');
  if (typeof value === 'bigint') return value < 0n ? 0n : value;
  if (typeof value === 'string' && /^\+?\d+$/.test(value) && BigInt(value) < 2n ** 64n) return BigInt(value);
  return 1000n;
}

/** @param {import('wharf').Outcome} outcome */
function describe(outcome) {
  switch (outcome.tag) {
    case 'ack':
      return 'Ack';
    case 'retry':
      return 'Retry';
    case 'retry-after':
      return `RetryAfter(${outcome.val})`;
    case 'drop':
      return 'Drop';
  }
}
