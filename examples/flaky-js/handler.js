// Decides by the body: `retry` retries at once, `later` retries after a delay
// (the application property `delay-ms`, default 1000), `bad` is dropped,
// anything else is acknowledged. `publish:ADDRESS` also sends the body on to
// ADDRESS (and answers the message's reply-to, if it has one), published
// with the ack; it is dropped if the mount does not grant that.
// `mirror:ADDRESS` sends one message to ADDRESS that mirrors the delivery:
// its body, group-id, group-sequence, reply-to-group-id, creation-time,
// absolute-expiry-time, priority and durable; its application properties,
// then `to` and `user-id` (when it has them), `first-acquirer`, and each
// message annotation as a property `annotation:KEY`. Acknowledged when the
// send is taken, dropped (with a warning) when not.
import { handler, ack, retry, retryAfter, drop, log, send, reply, SendError } from 'wharf';

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
      if (body?.startsWith('publish:')) outcome = publish(d, body.slice('publish:'.length));
      else if (body?.startsWith('mirror:')) outcome = mirror(d, body.slice('mirror:'.length));
      else outcome = ack();
  }
  log.info(`attempt ${d.attempt} of ${JSON.stringify(body ?? '<binary>')}: ${describe(outcome)}`);
  return outcome;
});

/** @param {import('wharf').Delivery} d */
function publish(d, address) {
  try {
    send(address, { body: d.body, subject: 'flaky', properties: { attempt: d.attempt } });
    if (d.replyTo !== undefined) reply(`sent to ${address}`);
    return ack();
  } catch (e) {
    if (!(e instanceof SendError)) throw e;
    log.warn(e.message);
    return drop();
  }
}

/**
 * @param {import('wharf').Delivery} d
 * @param {string} address
 */
function mirror(d, address) {
  const properties = [...d.properties];
  if (d.to !== undefined) properties.push({ key: 'to', value: { tag: 'string', val: d.to } });
  if (d.userId !== undefined) properties.push({ key: 'user-id', value: { tag: 'bytes', val: d.userId } });
  properties.push({ key: 'first-acquirer', value: { tag: 'boolean', val: d.firstAcquirer } });
  for (const { key, value } of d.annotations) properties.push({ key: `annotation:${key}`, value });
  try {
    send(address, {
      body: d.body,
      groupId: d.groupId,
      groupSequence: d.groupSequence,
      replyToGroupId: d.replyToGroupId,
      creationTime: d.creationTime,
      absoluteExpiryTime: d.absoluteExpiryTime,
      priority: d.priority,
      durable: d.durable,
      properties,
    });
    return ack();
  } catch (e) {
    if (!(e instanceof SendError)) throw e;
    log.warn(e.message);
    return drop();
  }
}

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
