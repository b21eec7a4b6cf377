// Write wharf message handlers in JavaScript.
//
//   import { handler, ack, retry, retryAfter, drop, log } from 'wharf';
//
//   export const handle = handler((d) => {
//     log.info(`attempt ${d.attempt} of ${d.text}`);
//     return d.text === 'later' ? retryAfter(2000) : ack();
//   });
//
// `wharf/build.mjs` bundles the handler with this module and turns it into a
// component of the world wharf:handler/handler.

import * as hostLog from 'wharf:handler/log@0.1.0';

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
  let delay;
  if (typeof ms === 'bigint') {
    delay = ms < 0n ? 0n : ms > U64_MAX ? U64_MAX : ms;
  } else if (typeof ms === 'number' && !Number.isNaN(ms)) {
    delay = ms <= 0 ? 0n : ms >= 2 ** 64 ? U64_MAX : BigInt(Math.floor(ms));
  } else {
    throw new TypeError(`retryAfter: expected milliseconds as a number or bigint, got ${typeof ms}`);
  }
  return Object.freeze({ tag: 'retry-after', val: delay });
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
    this.properties = raw.properties.map(({ key, value }) => ({ key, value: typedValue(value) }));
    this.address = raw.address;
    this.tenant = raw.tenant;
    this.mount = raw.mount;
    this.attempt = raw.attempt;
    this.presettled = raw.presettled;
  }

  /** The body as UTF-8 text, or undefined when it is not valid UTF-8. */
  get text() {
    if (this.#text === UNDECODED) this.#text = decodeUtf8(this.body);
    return this.#text ?? undefined;
  }

  /** The first application property called `key`, as a plain value. */
  property(key) {
    const found = this.properties.find((p) => p.key === key);
    return found === undefined ? undefined : plainValue(found.value);
  }
}

// StarlingMonkey lifts a list<u8> as a Uint8Array of another realm (so not
// `instanceof Uint8Array`), QuickJS as an array of numbers. The constructor
// copies either natively; `Uint8Array.from` would step through it byte by
// byte in the interpreter, microseconds a byte.
function bytes(list) {
  return list instanceof Uint8Array ? list : new Uint8Array(list);
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
function decodeUtf8(bytes) {
  if (typeof TextDecoder !== 'undefined') {
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      return null;
    }
  }
  let out = '';
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i];
    let cp;
    let n;
    if (b < 0x80) [cp, n] = [b, 1];
    else if (b >= 0xc2 && b < 0xe0) [cp, n] = [b & 0x1f, 2];
    else if (b >= 0xe0 && b < 0xf0) [cp, n] = [b & 0x0f, 3];
    else if (b >= 0xf0 && b < 0xf5) [cp, n] = [b & 0x07, 4];
    else return null;
    if (i + n > bytes.length) return null;
    for (let k = 1; k < n; k++) {
      const c = bytes[i + k];
      if ((c & 0xc0) !== 0x80) return null;
      cp = (cp << 6) | (c & 0x3f);
    }
    if ((n === 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) || (n === 4 && (cp < 0x10000 || cp > 0x10ffff))) {
      return null;
    }
    out += String.fromCodePoint(cp);
    i += n;
  }
  return out;
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
