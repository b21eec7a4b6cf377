// The SDK's conversions between the generated bindings (wharf:handler@0.3.0)
// and its own Delivery and message objects, against fake host imports: run
// with `node --test guest-sdk/js/test`. The engine is neither StarlingMonkey
// nor QuickJS here, so 64-bit integers are lowered as BigInt, as on
// StarlingMonkey; the raw deliveries below come in both engines' shapes.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { register } from 'node:module';

// Only the 0.3.0 interfaces resolve: the SDK must import those.
const hooks = `
const SOURCES = {
  'wharf:handler/log@0.3.0': 'export const log = (level, message) => globalThis.__wharfHost.log(level, message);',
  'wharf:handler/outbox@0.3.0':
    'export const send = (address, message) => globalThis.__wharfHost.send(address, message);' +
    'export const reply = (message) => globalThis.__wharfHost.reply(message);',
};
export async function resolve(specifier, context, next) {
  if (specifier in SOURCES) return { url: specifier, shortCircuit: true };
  return next(specifier, context);
}
export async function load(url, context, next) {
  if (url in SOURCES) return { format: 'module', source: SOURCES[url], shortCircuit: true };
  return next(url, context);
}
`;
register(`data:text/javascript,${encodeURIComponent(hooks)}`);

const host = { logs: [], sent: [], refuse: undefined };
globalThis.__wharfHost = {
  log: (level, message) => host.logs.push([level, message]),
  send(address, message) {
    if (host.refuse) throw Object.assign(new Error('refused'), { payload: host.refuse });
    host.sent.push([address, message]);
  },
  reply(message) {
    if (host.refuse) throw Object.assign(new Error('refused'), { payload: host.refuse });
    host.sent.push([undefined, message]);
  },
};

const wharf = await import('../wharf.js');
const { handler, ack, drop, send, reply, SendError } = wharf;

beforeEach(() => {
  host.logs = [];
  host.sent = [];
  host.refuse = undefined;
});

const utf8 = (text) => new TextEncoder().encode(text);

// A raw delivery as StarlingMonkey lifts it: options undefined, s64 BigInt.
function rawDelivery(fields = {}) {
  return {
    body: utf8('hello'),
    contentType: undefined,
    subject: undefined,
    messageId: undefined,
    correlationId: undefined,
    replyTo: undefined,
    to: undefined,
    userId: undefined,
    groupId: undefined,
    groupSequence: undefined,
    replyToGroupId: undefined,
    creationTime: undefined,
    absoluteExpiryTime: undefined,
    priority: 4,
    durable: false,
    firstAcquirer: false,
    properties: [],
    annotations: [],
    address: 'in',
    tenant: 't',
    mount: 'm',
    attempt: 1,
    presettled: false,
    ...fields,
  };
}

function delivered(raw) {
  let seen;
  handler((d) => {
    seen = d;
    return ack();
  })(raw);
  return seen;
}

test('a delivery shows every 0.3.0 field', () => {
  const d = delivered(
    rawDelivery({
      to: 'orders',
      userId: new Uint8Array([0x61, 0x00, 0xff]),
      groupId: 'g-1',
      groupSequence: 4294967295,
      replyToGroupId: 'rg',
      creationTime: 1700000000123n,
      absoluteExpiryTime: -5n,
      priority: 9,
      durable: true,
      firstAcquirer: true,
      annotations: [
        { key: 'x-opt-delivery-time', value: { tag: 'timestamp', val: 1700000000999n } },
        { key: '42', value: { tag: 'uint', val: 7n } },
      ],
    }),
  );
  assert.equal(d.to, 'orders');
  assert.deepEqual([...d.userId], [0x61, 0x00, 0xff]);
  assert.equal(d.groupId, 'g-1');
  assert.equal(d.groupSequence, 4294967295);
  assert.equal(d.replyToGroupId, 'rg');
  assert.equal(d.creationTime, 1700000000123n);
  assert.equal(d.absoluteExpiryTime, -5n);
  assert.equal(d.priority, 9);
  assert.equal(d.durable, true);
  assert.equal(d.firstAcquirer, true);
  assert.deepEqual(d.annotations, [
    { key: 'x-opt-delivery-time', value: { tag: 'timestamp', val: 1700000000999n } },
    { key: '42', value: { tag: 'uint', val: 7n } },
  ]);
  assert.deepEqual(d.annotation('x-opt-delivery-time'), new Date(1700000000999));
  assert.equal(d.annotation('42'), 7n);
  assert.equal(d.annotation('missing'), undefined);
});

test('absent fields are undefined, with either engine\'s shape', () => {
  const quickjs = {
    ...rawDelivery(),
    contentType: null,
    to: null,
    userId: null,
    groupId: null,
    groupSequence: null,
    replyToGroupId: null,
    creationTime: null,
    absoluteExpiryTime: null,
    body: [104, 105],
  };
  for (const raw of [rawDelivery(), quickjs]) {
    const d = delivered(raw);
    for (const field of ['to', 'userId', 'groupId', 'groupSequence', 'replyToGroupId', 'creationTime', 'absoluteExpiryTime']) {
      assert.equal(d[field], undefined, field);
    }
    assert.equal(d.priority, 4);
    assert.equal(d.durable, false);
    assert.equal(d.firstAcquirer, false);
    assert.deepEqual(d.annotations, []);
  }
  // QuickJS lifts s64 as numbers: the SDK still gives BigInt.
  const d = delivered({ ...quickjs, creationTime: 1700000000123, absoluteExpiryTime: 0, groupSequence: 0, priority: 0 });
  assert.equal(d.creationTime, 1700000000123n);
  assert.equal(d.absoluteExpiryTime, 0n);
  assert.equal(d.groupSequence, 0);
  assert.equal(d.priority, 0);
});

test('a message sets the 0.3.0 output fields', () => {
  send('out', {
    body: 'x',
    groupId: 'g',
    groupSequence: 3,
    replyToGroupId: 'rg',
    priority: 7,
    creationTime: new Date(1700000000123),
    absoluteExpiryTime: 1700000060000n,
    durable: false,
  });
  const [[address, m]] = host.sent;
  assert.equal(address, 'out');
  assert.equal(m.groupId, 'g');
  assert.equal(m.groupSequence, 3);
  assert.equal(m.replyToGroupId, 'rg');
  assert.equal(m.priority, 7);
  assert.equal(m.creationTime, 1700000000123n);
  assert.equal(m.absoluteExpiryTime, 1700000060000n);
  assert.equal(m.durable, false);
});

test('absent output fields are none; the 0.2 shape still works', () => {
  send('out', 'body only');
  reply({ body: utf8('b'), subject: 's', properties: { n: 1 }, delay: 10, groupId: null, priority: undefined });
  for (const [, m] of host.sent) {
    for (const field of ['groupId', 'groupSequence', 'replyToGroupId', 'priority', 'creationTime', 'absoluteExpiryTime']) {
      assert.ok(field in m, field);
      assert.equal(m[field], undefined, field);
    }
    assert.equal(m.durable, true);
  }
  const [, [, second]] = host.sent;
  assert.equal(second.subject, 's');
  assert.equal(second.delay, 10n);
  assert.deepEqual(second.properties, [{ key: 'n', value: { tag: 'int', val: 1n } }]);
});

test('malformed output fields are TypeErrors', () => {
  for (const bad of [
    { priority: 256 },
    { priority: -1 },
    { priority: 1.5 },
    { priority: '4' },
    { groupSequence: 2 ** 32 },
    { groupId: 5 },
    { replyToGroupId: true },
    { creationTime: 1.5 },
    { creationTime: 1n << 63n },
    { absoluteExpiryTime: new Date(NaN) },
    { absoluteExpiryTime: '2024' },
  ]) {
    assert.throws(() => send('out', { body: '', ...bad }), TypeError, JSON.stringify(Object.keys(bad)));
  }
  assert.equal(host.sent.length, 0);
});

test('a delivery\'s properties and annotations pass on with their types', () => {
  const properties = [
    { key: 'u', value: { tag: 'uint', val: 5n } },
    { key: 'i', value: { tag: 'int', val: -5n } },
    { key: 'f', value: { tag: 'float', val: 1 } },
    { key: 's', value: { tag: 'string', val: 'text' } },
    { key: 'b', value: { tag: 'bytes', val: new Uint8Array([1, 2]) } },
    { key: 't', value: { tag: 'timestamp', val: 17n } },
    { key: 'n', value: { tag: 'null' } },
    { key: 'o', value: { tag: 'other', val: 'uuid:1' } },
    { key: 'y', value: { tag: 'boolean', val: false } },
  ];
  const d = delivered(rawDelivery({ properties, annotations: [{ key: 'x-opt-a', value: { tag: 'uint', val: 0n } }] }));
  send('out', {
    body: d.body,
    properties: [...d.properties, ...d.annotations.map(({ key, value }) => ({ key: `annotation:${key}`, value }))],
  });
  const [[, m]] = host.sent;
  assert.deepEqual(m.properties, [...properties, { key: 'annotation:x-opt-a', value: { tag: 'uint', val: 0n } }]);
});

test('a refused message is a SendError', () => {
  host.refuse = 'denied';
  const outcome = handler(() => {
    try {
      send('nope', { body: '', priority: 1 });
      return ack();
    } catch (e) {
      assert.ok(e instanceof SendError);
      assert.equal(e.code, 'denied');
      return drop();
    }
  })(rawDelivery());
  assert.deepEqual(outcome, { tag: 'drop' });
});
