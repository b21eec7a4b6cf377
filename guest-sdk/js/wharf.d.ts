// Types of the wharf JavaScript SDK (wharf.js). The contract behind them is
// wit/handler.wit (wharf:handler@0.3.0).

/** A typed value of an AMQP application property. 64-bit integers are BigInt. */
export type Value =
  | { tag: 'string'; val: string } // AMQP string and symbol
  | { tag: 'int'; val: bigint } // byte, short, int, long
  | { tag: 'uint'; val: bigint } // ubyte, ushort, uint, ulong
  | { tag: 'float'; val: number } // float, double
  | { tag: 'boolean'; val: boolean }
  | { tag: 'bytes'; val: Uint8Array } // binary
  | { tag: 'timestamp'; val: bigint } // milliseconds since the Unix epoch
  | { tag: 'null' }
  | { tag: 'other'; val: string }; // uuid, char, decimal, list, map, ... as text

/** A property value without its tag: a timestamp becomes a Date, null stays null. */
export type PlainValue = string | bigint | number | boolean | Uint8Array | Date | null;

/** One application property (the message's own key/value metadata), or one message annotation. */
export interface Property {
  key: string;
  value: Value;
}

/** One delivery of one message to this handler. */
export interface Delivery {
  /** The message body: its data sections, or an amqp-value string or binary. */
  readonly body: Uint8Array;
  /** The body as UTF-8 text; undefined when the body is not valid UTF-8. */
  readonly text: string | undefined;
  /** properties.content-type */
  readonly contentType: string | undefined;
  /** properties.subject */
  readonly subject: string | undefined;
  /** properties.message-id, rendered as text whatever its AMQP type. */
  readonly messageId: string | undefined;
  /** properties.correlation-id, rendered as text. */
  readonly correlationId: string | undefined;
  /** properties.reply-to */
  readonly replyTo: string | undefined;
  /** properties.to: the address its publisher wrote on it (not always the one it came from). */
  readonly to: string | undefined;
  /** properties.user-id: the identity its publisher claims. */
  readonly userId: Uint8Array | undefined;
  /** properties.group-id: the group (Artemis' and ActiveMQ's message group) it belongs to. */
  readonly groupId: string | undefined;
  /** properties.group-sequence: its place within its group (a u32). */
  readonly groupSequence: number | undefined;
  /** properties.reply-to-group-id */
  readonly replyToGroupId: string | undefined;
  /** properties.creation-time: milliseconds since the Unix epoch. */
  readonly creationTime: bigint | undefined;
  /** properties.absolute-expiry-time: milliseconds since the Unix epoch. */
  readonly absoluteExpiryTime: bigint | undefined;
  /** header.priority, 0 to 255: 4 when the message carries none. */
  readonly priority: number;
  /** header.durable */
  readonly durable: boolean;
  /**
   * header.first-acquirer, as the broker sets it (many leave it false);
   * `attempt` is what counts deliveries.
   */
  readonly firstAcquirer: boolean;
  /** The application properties, in the order the message carries them. */
  readonly properties: readonly Property[];
  /**
   * The message annotations, in the order the message carries them, keys as
   * text (a numeric key as its decimal digits): the broker's (`x-opt-*`) and
   * wharf's own (`x-opt-delivery-time` on a delayed retry copy,
   * `x-opt-wharf-dead-letter-reason` on a dead letter).
   */
  readonly annotations: readonly Property[];
  /** The address the mount subscribes to. */
  readonly address: string;
  /** The tenant that owns the mount. */
  readonly tenant: string;
  /** The mount this delivery arrived on. */
  readonly mount: string;
  /** Which attempt this is; the first delivery of a message is attempt 1. */
  readonly attempt: number;
  /** True on an at-most-once mount: ack, drop and retry change nothing on the broker. */
  readonly presettled: boolean;
  /**
   * The value of the first application property called `key`, without its
   * tag (see PlainValue); undefined when there is none.
   */
  property(key: string): PlainValue | undefined;
  /** The value of the first message annotation called `key`, as `property` does. */
  annotation(key: string): PlainValue | undefined;
}

/** What the handler decided. */
export type Outcome =
  | { readonly tag: 'ack' }
  | { readonly tag: 'retry' }
  | { readonly tag: 'retry-after'; readonly val: bigint }
  | { readonly tag: 'drop' };

/** Processed: the message leaves the queue. */
export function ack(): Outcome;
/** Failed: deliver it again (counts towards the mount's attempt limit). */
export function retry(): Outcome;
/** Failed: deliver it again, not before `ms` milliseconds (negative means 0). */
export function retryAfter(ms: number | bigint): Outcome;
/** Never deliver it again: the broker's dead-letter policy decides. */
export function drop(): Outcome;

/**
 * Logging into the host's log, tagged with tenant and mount. Arguments are
 * joined with spaces; non-strings are written as JSON.
 */
export const log: {
  trace(...parts: unknown[]): void;
  debug(...parts: unknown[]): void;
  info(...parts: unknown[]): void;
  warn(...parts: unknown[]): void;
  error(...parts: unknown[]): void;
};

/**
 * An application property value to send: a typed Value, or a plain one:
 * string, boolean, bigint (int; uint beyond the s64 range), number (int when
 * a safe integer, else float), Uint8Array (bytes), Date (timestamp), null.
 */
export type PropertyInput = Value | string | boolean | bigint | number | Uint8Array | Date | null;

/** A message to publish; only `body` is required. */
export interface Message {
  /** The body, sent as one data section: a string is sent as UTF-8. */
  body: string | Uint8Array;
  /** properties.content-type */
  contentType?: string;
  /** properties.subject */
  subject?: string;
  /**
   * properties.message-id. When absent the host derives one from the
   * delivery's message-id and the output's index, so a redelivered message
   * publishes its outputs with the same ids.
   */
  messageId?: string;
  /** properties.correlation-id; `reply` takes the delivery's when absent. */
  correlationId?: string;
  /**
   * Application properties: an object of key: value, or a list of
   * { key, value } (e.g. a delivery's `properties`, to pass them on).
   */
  properties?: Record<string, PropertyInput> | readonly { key: string; value: PropertyInput }[];
  /** Whether the broker keeps the message on disk; true when absent. */
  durable?: boolean;
  /**
   * properties.group-id: on Artemis and ActiveMQ Classic the broker's message
   * group (one consumer at a time gets a group's messages).
   */
  groupId?: string;
  /** properties.group-sequence, 0 to 2^32-1. */
  groupSequence?: number | bigint;
  /** properties.reply-to-group-id */
  replyToGroupId?: string;
  /** header.priority, 0 to 255 (brokers order by 0 to 9); the broker's default, 4, when absent. */
  priority?: number | bigint;
  /** properties.creation-time: milliseconds since the Unix epoch, or a Date. */
  creationTime?: number | bigint | Date;
  /**
   * properties.absolute-expiry-time: milliseconds since the Unix epoch, or a
   * Date; brokers that honour it discard the message after.
   */
  absoluteExpiryTime?: number | bigint | Date;
  /**
   * Deliver no sooner than this many milliseconds after publishing, on
   * brokers that schedule messages (Artemis).
   */
  delay?: number | bigint;
}

/** Why the host did not take a message. */
export type SendErrorCode = 'denied' | 'too-many' | 'too-large' | 'no-reply-to';

/**
 * Thrown by `send` and `reply` when the host refuses a message (nothing of
 * it is kept): `denied` (the mount's grants.send does not match the address,
 * or grants.reply is off), `too-many` (max_outputs reached), `too-large`
 * (max_output_bytes exceeded), `no-reply-to` (reply on a delivery without
 * a reply-to).
 */
export class SendError extends Error {
  readonly name: 'SendError';
  readonly code: SendErrorCode;
  /** The address given to `send`; undefined for `reply`. */
  readonly address: string | undefined;
}

/**
 * Publishes a message to `address` if the handler returns `ack()`, before
 * the delivery is accepted; any other outcome or a thrown error discards
 * it. Throws a SendError when the host refuses it, a TypeError when the
 * message is malformed.
 */
export function send(address: string, message: string | Uint8Array | Message): void;

/**
 * Publishes a message to the delivery's reply-to if the handler returns
 * `ack()`; its correlationId, unless given, is the delivery's
 * correlation-id, else its message-id. Throws a SendError as `send` does.
 */
export function reply(message: string | Uint8Array | Message): void;

/** The shape of the component's `handle` export. */
export type Handle = (raw: unknown) => unknown;

/**
 * Registers the handler: `export const handle = handler((d) => ack())`.
 * A thrown error counts as `retry`. With the default engine
 * (StarlingMonkey) the function may be async.
 */
export function handler(fn: (d: Delivery) => Outcome | Promise<Outcome>): Handle;
