// Types of the wharf JavaScript SDK (wharf.js). The contract behind them is
// wit/handler.wit (wharf:handler@0.1.0).

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

/** One application property: the message's own key/value metadata. */
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
  /** The application properties, in the order the message carries them. */
  readonly properties: readonly Property[];
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

/** The shape of the component's `handle` export. */
export type Handle = (raw: unknown) => unknown;

/**
 * Registers the handler: `export const handle = handler((d) => ack())`.
 * A thrown error counts as `retry`. With the default engine
 * (StarlingMonkey) the function may be async.
 */
export function handler(fn: (d: Delivery) => Outcome | Promise<Outcome>): Handle;
