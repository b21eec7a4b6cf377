// Write wharf message handlers in JavaScript.
//
//   import { handler, ack, retry, retryAfter, drop, log, send } from 'wharf';
//
//   export const handle = handler((d) => {
//     log.info(`attempt ${d.attempt} of ${d.text}`);
//     if (d.text === 'later') return retryAfter(2000);
//     send('audit', { body: d.body, subject: 'seen' }); // published only with the ack
//     return ack();
//   });
//
// `wharf/build.mjs` bundles the handler with this module and turns it into a
// component of the world wharf:handler/handler.

import * as hostLog from 'wharf:handler/log@0.3.0';
import * as hostOutbox from 'wharf:handler/outbox@0.3.0';
import { decodeUtf8 } from './utf8.js';

// The engines disagree on a few representations: StarlingMonkey
// (componentize-js) passes u64/s64 as BigInt, options as undefined and an
// interface import as named exports; QuickJS (componentize-qjs) passes 64-bit
// integers as numbers, options as null and an interface import as one default
// export. The build defines __WHARF_ENGINE__; the SDK gives handlers one shape.
/* global __WHARF_ENGINE__, __WHARF_GRANTS__ */
const QUICKJS = typeof __WHARF_ENGINE__ !== 'undefined' && __WHARF_ENGINE__ === 'quickjs';
const STARLINGMONKEY = typeof __WHARF_ENGINE__ !== 'undefined' && __WHARF_ENGINE__ === 'starlingmonkey';
const GRANTS = typeof __WHARF_GRANTS__ !== 'undefined' ? __WHARF_GRANTS__ : [];

const writeLog = hostLog.log ?? hostLog.default.log;
const outbox = hostOutbox.send ? hostOutbox : hostOutbox.default;

const U64_MAX = (1n << 64n) - 1n;

/** Processed: the message leaves the queue. */
export function ack() {
  return ACK;
}

/** Failed: deliver the message again (counts towards the mount's attempt limit). */
export function retry() {
  return RETRY;
}

/**
 * Failed: deliver the message again, not before `ms` milliseconds.
 * @param {number | bigint} ms
 */
export function retryAfter(ms) {
  return Object.freeze({ tag: 'retry-after', val: millis(ms, 'retryAfter') });
}

// Milliseconds as a u64 BigInt: negative is 0, beyond u64 the maximum.
function millis(ms, what) {
  if (typeof ms === 'bigint') return ms < 0n ? 0n : ms > U64_MAX ? U64_MAX : ms;
  if (typeof ms === 'number' && !Number.isNaN(ms)) {
    return ms <= 0 ? 0n : ms >= 2 ** 64 ? U64_MAX : BigInt(Math.floor(ms));
  }
  throw new TypeError(`${what}: expected milliseconds as a number or bigint, got ${typeof ms}`);
}

/** Never deliver the message again: the broker's dead-letter policy decides. */
export function drop() {
  return DROP;
}

const ACK = Object.freeze({ tag: 'ack' });
const RETRY = Object.freeze({ tag: 'retry' });
const DROP = Object.freeze({ tag: 'drop' });

function stringify(parts) {
  return parts.map((p) => (typeof p === 'string' ? p : inspect(p))).join(' ');
}

function inspect(value) {
  if (value instanceof Error) return value.stack ? `${value}\n${value.stack}` : String(value);
  if (typeof value === 'bigint') return `${value}`;
  if (value === undefined || typeof value === 'function' || typeof value === 'symbol') return String(value);
  try {
    return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? `${v}` : v)) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * Logging into the host's log; every line is tagged with tenant and mount.
 * Arguments are joined with spaces, non-strings rendered as JSON.
 */
export const log = Object.freeze({
  trace: (...parts) => writeLog('trace', stringify(parts)),
  debug: (...parts) => writeLog('debug', stringify(parts)),
  info: (...parts) => writeLog('info', stringify(parts)),
  warn: (...parts) => writeLog('warn', stringify(parts)),
  error: (...parts) => writeLog('error', stringify(parts)),
});

// ---- Publishing -----------------------------------------------------------

const SEND_ERRORS = ['denied', 'too-many', 'too-large', 'no-reply-to'];

function explain(code, address) {
  switch (code) {
    case 'denied':
      return address === undefined
        ? 'the mount does not grant replying (grants.reply)'
        : 'the mount does not grant this address (grants.send)';
    case 'too-many':
      return "the delivery already has the mount's max_outputs messages";
    case 'too-large':
      return "the delivery's messages would exceed the mount's max_output_bytes";
    case 'no-reply-to':
      return 'the delivery has no reply-to';
  }
  return 'unknown error';
}

/**
 * Why `send` or `reply` did not take a message: `code` is `'denied'`,
 * `'too-many'`, `'too-large'` or `'no-reply-to'`. Nothing was kept of it.
 */
export class SendError extends Error {
  constructor(code, address) {
    const to = address === undefined ? 'reply' : `send to ${JSON.stringify(address)}`;
    super(`${to}: ${code} (${explain(code, address)})`);
    this.name = 'SendError';
    /** 'denied' | 'too-many' | 'too-large' | 'no-reply-to' */
    this.code = code;
    /** The address given to `send`; undefined for `reply`. */
    this.address = address;
  }
}

/**
 * Publishes `message` to `address` if the handler returns `ack()` (before
 * the delivery is accepted); any other outcome or a thrown error discards it.
 * `message` is a body (string as UTF-8, or Uint8Array) or an object
 * `{ body, contentType, subject, messageId, correlationId, properties,
 * durable, groupId, groupSequence, replyToGroupId, priority, creationTime,
 * absoluteExpiryTime, delay }`. Returns nothing; throws a `SendError` (see
 * its `code`) when the host refuses the message.
 */
export function send(address, message) {
  if (typeof address !== 'string') {
    throw new TypeError(`send: expected the address as a string, got ${typeof address}`);
  }
  const lowered = toWitMessage(message, 'send');
  try {
    outbox.send(address, lowered);
  } catch (e) {
    throw sendError(e, address);
  }
}

/**
 * Publishes `message` (as for `send`) to the delivery's reply-to if the
 * handler returns `ack()`; its correlationId, unless given, is the
 * delivery's correlation-id, else its message-id. Throws a `SendError`
 * (`'no-reply-to'` when the delivery has none).
 */
export function reply(message) {
  const lowered = toWitMessage(message, 'reply');
  try {
    outbox.reply(lowered);
  } catch (e) {
    throw sendError(e, undefined);
  }
}

// Both engines throw an Error whose `payload` is the send-error's name.
function sendError(e, address) {
  const code = e?.payload;
  return SEND_ERRORS.includes(code) ? new SendError(code, address) : e;
}

const MESSAGE_FIELDS = [
  'body',
  'contentType',
  'subject',
  'messageId',
  'correlationId',
  'properties',
  'durable',
  'groupId',
  'groupSequence',
  'replyToGroupId',
  'priority',
  'creationTime',
  'absoluteExpiryTime',
  'delay',
];

function toWitMessage(message, what) {
  if (typeof message === 'string' || isBinary(message)) message = { body: message };
  if (message === null || typeof message !== 'object') {
    throw new TypeError(`${what}: expected a body (string or Uint8Array) or a message object, got ${inspect(message)}`);
  }
  for (const key of Object.keys(message)) {
    if (!MESSAGE_FIELDS.includes(key)) {
      throw new TypeError(`${what}: unknown message field "${key}" (fields: ${MESSAGE_FIELDS.join(', ')})`);
    }
  }
  const { body, durable = true, delay } = message;
  if (typeof body !== 'string' && !isBinary(body)) {
    throw new TypeError(`${what}: the message body must be a string or a Uint8Array, got ${inspect(body)}`);
  }
  if (typeof durable !== 'boolean') throw new TypeError(`${what}: durable must be a boolean`);
  return {
    body: typeof body === 'string' ? encodeUtf8(body) : toBytes(body),
    contentType: optionalString(message, 'contentType', what),
    subject: optionalString(message, 'subject', what),
    messageId: optionalString(message, 'messageId', what),
    correlationId: optionalString(message, 'correlationId', what),
    properties: toWitProperties(message.properties, what),
    durable,
    groupId: optionalString(message, 'groupId', what),
    groupSequence: optionalInteger(message, 'groupSequence', 2 ** 32 - 1, what),
    replyToGroupId: optionalString(message, 'replyToGroupId', what),
    priority: optionalInteger(message, 'priority', 255, what),
    creationTime: optionalTime(message, 'creationTime', what),
    absoluteExpiryTime: optionalTime(message, 'absoluteExpiryTime', what),
    delay: delay === undefined || delay === null ? undefined : u64(millis(delay, `${what}: delay`)),
  };
}

function optionalString(message, field, what) {
  const value = message[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string') throw new TypeError(`${what}: ${field} must be a string, got ${inspect(value)}`);
  return value;
}

// A u8 or u32 field: an integer number or bigint from 0 to `max`.
function optionalInteger(message, field, max, what) {
  const value = message[field];
  if (value === undefined || value === null) return undefined;
  const n = typeof value === 'bigint' ? value : Number.isInteger(value) ? BigInt(value) : undefined;
  if (n === undefined || n < 0n || n > BigInt(max)) {
    throw new TypeError(`${what}: ${field} must be an integer from 0 to ${max}, got ${inspect(value)}`);
  }
  return Number(n);
}

// A time field: milliseconds since the Unix epoch (number or bigint), or a Date.
function optionalTime(message, field, what) {
  const value = message[field];
  if (value === undefined || value === null) return undefined;
  let n;
  if (value instanceof Date) n = Number.isNaN(value.getTime()) ? undefined : BigInt(value.getTime());
  else if (typeof value === 'bigint') n = value;
  else if (Number.isInteger(value)) n = BigInt(value);
  if (n === undefined || n < S64_MIN || n > S64_MAX) {
    throw new TypeError(
      `${what}: ${field} must be milliseconds since the Unix epoch (a 64-bit integer) or a Date, got ${inspect(value)}`,
    );
  }
  return s64(n);
}

// Properties: Delivery.properties' shape ([{ key, value: { tag, val } }], so
// a delivery's can be passed on), or a plain object of key: value.
function toWitProperties(properties, what) {
  if (properties === undefined || properties === null) return [];
  const pairs = Array.isArray(properties)
    ? properties.map((p) => {
        if (p === null || typeof p !== 'object' || typeof p.key !== 'string') {
          throw new TypeError(`${what}: a property in a list must be { key, value }, got ${inspect(p)}`);
        }
        return [p.key, p.value];
      })
    : typeof properties === 'object'
      ? Object.entries(properties)
      : null;
  if (pairs === null) throw new TypeError(`${what}: properties must be an object or a list of { key, value }`);
  return pairs.map(([key, value]) => ({ key, value: toWitValue(value, key, what) }));
}

const S64_MIN = -(1n << 63n);
const S64_MAX = (1n << 63n) - 1n;

// A property value, typed ({ tag, val }) or plain: string, boolean, bigint
// (int, or uint beyond s64), number (int when a safe integer, else float),
// Uint8Array (bytes), Date (timestamp), null.
function toWitValue(value, key, what) {
  const bad = () => new TypeError(`${what}: property "${key}" has an unsupported value ${inspect(value)}`);
  if (value === null) return { tag: 'null' };
  if (value instanceof Date) return { tag: 'timestamp', val: s64(BigInt(value.getTime())) };
  if (isBinary(value)) return { tag: 'bytes', val: toBytes(value) };
  switch (typeof value) {
    case 'string':
      return { tag: 'string', val: value };
    case 'boolean':
      return { tag: 'boolean', val: value };
    case 'bigint':
      if (value >= S64_MIN && value <= S64_MAX) return { tag: 'int', val: s64(value) };
      if (value >= 0n && value <= U64_MAX) return { tag: 'uint', val: u64(value) };
      throw new RangeError(`${what}: property "${key}" is beyond 64 bits: ${value}`);
    case 'number':
      return Number.isSafeInteger(value) ? { tag: 'int', val: s64(BigInt(value)) } : { tag: 'float', val: value };
    case 'object':
      return typedToWit(value, bad);
    default:
      throw bad();
  }
}

function typedToWit({ tag, val }, bad) {
  const integer = (min, max) => {
    const n = typeof val === 'bigint' ? val : Number.isSafeInteger(val) ? BigInt(val) : undefined;
    if (n === undefined || n < min || n > max) throw bad();
    return n;
  };
  switch (tag) {
    case 'string':
    case 'other':
      if (typeof val !== 'string') throw bad();
      return { tag, val };
    case 'int':
    case 'timestamp':
      return { tag, val: s64(integer(S64_MIN, S64_MAX)) };
    case 'uint':
      return { tag, val: u64(integer(0n, U64_MAX)) };
    case 'float':
      if (typeof val !== 'number') throw bad();
      return { tag, val };
    case 'boolean':
      if (typeof val !== 'boolean') throw bad();
      return { tag, val };
    case 'bytes':
      if (!isBinary(val)) throw bad();
      return { tag, val: toBytes(val) };
    case 'null':
      return { tag };
    default:
      throw bad();
  }
}

// 64-bit integers as each engine lowers them: BigInt, or a number on QuickJS.
function u64(n) {
  return QUICKJS ? Number(n) : n;
}
const s64 = u64;

function isBinary(value) {
  return ArrayBuffer.isView(value) || Object.prototype.toString.call(value) === '[object ArrayBuffer]';
}

function toBytes(value) {
  if (value instanceof Uint8Array) return value;
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  return new Uint8Array(value);
}

// QuickJS has no TextEncoder. Lone surrogates become U+FFFD, as with TextEncoder.
function encodeUtf8(text) {
  if (typeof TextEncoder !== 'undefined') return new TextEncoder().encode(text);
  const out = [];
  for (let i = 0; i < text.length; i++) {
    let cp = text.charCodeAt(i);
    if (cp >= 0xd800 && cp < 0xdc00 && i + 1 < text.length) {
      const low = text.charCodeAt(i + 1);
      if (low >= 0xdc00 && low < 0xe000) {
        cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        i++;
      }
    }
    if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd;
    if (cp < 0x80) out.push(cp);
    else if (cp < 0x800) out.push(0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
    else if (cp < 0x10000) out.push(0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
    else out.push(0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
  }
  return new Uint8Array(out);
}


const UNDECODED = Symbol('undecoded');

// QuickJS has no console: route it to the host's log so handlers and the
// libraries they bundle can still write lines.
if (typeof globalThis.console === 'undefined') {
  globalThis.console = {
    log: log.info,
    info: log.info,
    debug: log.debug,
    trace: log.trace,
    warn: log.warn,
    error: log.error,
  };
}

// StarlingMonkey built without its clocks or random feature (so that it calls
// no WASI function the mount does not grant) would answer with the time of the
// build and the same "random" numbers in every instance. Fail loudly instead.
if (STARLINGMONKEY) {
  if (!GRANTS.includes('clocks')) guardClocks();
  if (!GRANTS.includes('random')) guardRandom();
}

function denied(what, grant) {
  return new Error(
    `${what} needs the ${grant} grant: add "${grant}" to "wharf": { "grants": [...] } in package.json ` +
      `and grant ${grant} to the mount`,
  );
}

function replace(object, name, value) {
  try {
    Object.defineProperty(object, name, { value, writable: true, configurable: true });
  } catch {
    // Leave what cannot be replaced.
  }
}

function guardClocks() {
  const RealDate = Date;
  function GuardedDate(...args) {
    if (!new.target) throw denied('Date()', 'clocks');
    if (args.length === 0) throw denied('new Date()', 'clocks');
    return Reflect.construct(RealDate, args, new.target);
  }
  Object.setPrototypeOf(GuardedDate, RealDate);
  GuardedDate.prototype = RealDate.prototype;
  replace(GuardedDate, 'now', () => {
    throw denied('Date.now()', 'clocks');
  });
  replace(globalThis, 'Date', GuardedDate);
  if (globalThis.performance) {
    replace(globalThis.performance, 'now', () => {
      throw denied('performance.now()', 'clocks');
    });
  }
  for (const timer of ['setTimeout', 'setInterval']) {
    replace(globalThis, timer, () => {
      throw denied(`${timer}()`, 'clocks');
    });
  }
}

function guardRandom() {
  replace(Math, 'random', () => {
    throw denied('Math.random()', 'random');
  });
  if (globalThis.crypto) {
    for (const name of ['getRandomValues', 'randomUUID']) {
      replace(globalThis.crypto, name, () => {
        throw denied(`crypto.${name}()`, 'random');
      });
    }
  }
}

/** One delivery of one message: see wharf.d.ts. */
export class Delivery {
  #text = UNDECODED;

  constructor(raw) {
    this.body = bytes(raw.body);
    this.contentType = raw.contentType ?? undefined;
    this.subject = raw.subject ?? undefined;
    this.messageId = raw.messageId ?? undefined;
    this.correlationId = raw.correlationId ?? undefined;
    this.replyTo = raw.replyTo ?? undefined;
    this.to = raw.to ?? undefined;
    this.userId = raw.userId == null ? undefined : bytes(raw.userId);
    this.groupId = raw.groupId ?? undefined;
    this.groupSequence = raw.groupSequence ?? undefined;
    this.replyToGroupId = raw.replyToGroupId ?? undefined;
    this.creationTime = raw.creationTime == null ? undefined : BigInt(raw.creationTime);
    this.absoluteExpiryTime = raw.absoluteExpiryTime == null ? undefined : BigInt(raw.absoluteExpiryTime);
    this.priority = raw.priority;
    this.durable = raw.durable;
    this.firstAcquirer = raw.firstAcquirer;
    this.properties = typedProperties(raw.properties);
    this.annotations = typedProperties(raw.annotations);
    this.address = raw.address;
    this.tenant = raw.tenant;
    this.mount = raw.mount;
    this.attempt = raw.attempt;
    this.presettled = raw.presettled;
  }

  /** The body as UTF-8 text, or undefined when it is not valid UTF-8. */
  get text() {
    if (this.#text === UNDECODED) this.#text = decodeText(this.body);
    return this.#text ?? undefined;
  }

  /** The first application property called `key`, as a plain value. */
  property(key) {
    return plainLookup(this.properties, key);
  }

  /** The first message annotation called `key`, as a plain value. */
  annotation(key) {
    return plainLookup(this.annotations, key);
  }
}

function typedProperties(list) {
  return list.map(({ key, value }) => ({ key, value: typedValue(value) }));
}

function plainLookup(list, key) {
  const found = list.find((p) => p.key === key);
  return found === undefined ? undefined : plainValue(found.value);
}

// StarlingMonkey lifts a list<u8> as a Uint8Array of another realm (so not
// `instanceof Uint8Array`), QuickJS as an array of numbers. `set` copies a
// typed array of any realm as one block; the constructor would read another
// realm's array element by element (40 µs for 256 bytes), and
// `Uint8Array.from` would step through it in the interpreter.
function bytes(list) {
  if (list instanceof Uint8Array) return list;
  const copy = new Uint8Array(list.length);
  copy.set(list);
  return copy;
}

function typedValue(value) {
  switch (value.tag) {
    case 'int':
    case 'uint':
    case 'timestamp':
      return { tag: value.tag, val: BigInt(value.val) };
    case 'bytes':
      return { tag: value.tag, val: bytes(value.val) };
    case 'null':
      return { tag: 'null' };
    default:
      return { tag: value.tag, val: value.val };
  }
}

function plainValue(value) {
  switch (value.tag) {
    case 'null':
      return null;
    case 'timestamp':
      return new Date(Number(value.val));
    default:
      return value.val;
  }
}

// QuickJS has no TextDecoder; a strict decoder keeps `text` the same on both.
function decodeText(bytes) {
  if (typeof TextDecoder !== 'undefined') {
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      return null;
    }
  }
  return decodeUtf8(bytes);
}

function toWit(outcome) {
  switch (outcome?.tag) {
    case 'ack':
    case 'retry':
    case 'drop':
      return { tag: outcome.tag };
    case 'retry-after': {
      const ms = retryAfter(outcome.val).val;
      return { tag: 'retry-after', val: QUICKJS ? Number(ms) : ms };
    }
    default:
      throw new TypeError(
        `the handler returned ${inspect(outcome)}; return ack(), retry(), retryAfter(ms) or drop()`,
      );
  }
}

/**
 * Turns `fn(delivery) -> outcome` into the component's `handle` export:
 * `export const handle = handler(fn)`. With the default engine
 * (StarlingMonkey) `fn` may be async; QuickJS runs only plain functions.
 */
export function handler(fn) {
  if (typeof fn !== 'function') throw new TypeError('handler() takes a function');
  return function handle(raw) {
    const outcome = fn(new Delivery(raw));
    if (outcome && typeof outcome.then === 'function') {
      if (QUICKJS) throw new TypeError('the quickjs engine cannot wait for an async handler; use starlingmonkey');
      return outcome.then(toWit);
    }
    return toWit(outcome);
  };
}
