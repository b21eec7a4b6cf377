#!/usr/bin/env node
// A second AMQP 1.0 client for wharf's integration tests: publishes messages
// that fe2o3-amqp cannot build (structured application properties, sequence
// and value bodies, several data sections, oversized messages), using rhea.
//
//   tests/peers/rhea/install      # once: npm ci into tests/peers/rhea/node_modules
//   node tests/peers/rhea/publish.mjs --url amqp://admin:admin@127.0.0.1:5672 \
//        --address ADDR --kind KIND --id MESSAGE_ID \
//        [--size BYTES] [--count N] [--script S] [--timeout SECONDS]
//
// Publishes one message with message-id MESSAGE_ID, or N with ids
// MESSAGE_ID-0 .. MESSAGE_ID-(N-1), waits for each disposition and prints one
// JSON line per message, in the order settled:
//   {"id":"...","state":"accepted"|"rejected"|"released"|"modified","error":null|{...}}
// Exit 0 only if every message was accepted; 1 if any was not; 2 on usage,
// connection or link errors, or when --timeout (default 30 s) passes first.
//
// Every message is durable, has a string message-id, and carries the string
// application property `script` only if --script is given. Integers below are
// always AMQP `int` (rhea would pick uint for a bare positive JS number).
//
// KIND                encodes to
//   plain               one data section "hello" (also the body of the *-property kinds)
//   list-property       app property k = list [int 1, int 2], s = string "x"
//   map-property        app property k = map {string "a": int 1}
//   array-property      app property k = array of int [1, 2, 3]
//   described-property  app property k = described (symbol "x:d") string "v"
//   uuid-property       app property k = uuid 00112233-4455-6677-8899-aabbccddeeff
//   sequence-body       one amqp-sequence section [int 1, string "two", true]
//   value-map-body      amqp-value map {string "order": int 7, string "item": string "book"}
//   value-list-body     amqp-value list [int 1, int 2]
//   data-sections       two data sections "ab", "cd"
//   big                 one data section of --size bytes of 'x' (default 2 MiB)
//
// Without user/password in the URL it authenticates with SASL ANONYMOUS.
// Note that AMQP 1.0 restricts application-property values to simple types;
// the list/map/array/described kinds break that on purpose.

import rhea from 'rhea';

const { types, message } = rhea;
const int = types.wrap_int;

const UUID = '00112233-4455-6677-8899-aabbccddeeff';

const hello = () => message.data_section(Buffer.from('hello'));

// Each kind gives application properties and/or a body; property kinds carry
// the plain body so that only the property is unusual.
const KINDS = {
    'plain': () => ({ body: hello() }),
    'list-property': () => ({ props: { k: types.wrap_list([int(1), int(2)]), s: 'x' } }),
    'map-property': () => ({ props: { k: types.wrap_map({ a: int(1) }) } }),
    'array-property': () => ({ props: { k: types.wrap_array([1, 2, 3], types.Int.typecode) } }),
    'described-property': () => ({ props: { k: types.wrap_described('v', 'x:d') } }),
    'uuid-property': () => ({ props: { k: types.wrap_uuid(rhea.string_to_uuid(UUID)) } }),
    'sequence-body': () => ({ body: message.sequence_section([int(1), 'two', true]) }),
    'value-map-body': () => ({ body: types.wrap_map({ order: int(7), item: 'book' }) }),
    'value-list-body': () => ({ body: types.wrap_list([int(1), int(2)]) }),
    'data-sections': () => ({ body: message.data_sections([Buffer.from('ab'), Buffer.from('cd')]) }),
    'big': (size) => ({ body: message.data_section(Buffer.alloc(size, 'x')) }),
};

function usage(problem) {
    console.error(`publish.mjs: ${problem}
usage: node publish.mjs --url URL --address ADDR --kind KIND --id MESSAGE_ID
                        [--size BYTES] [--count N] [--script S] [--timeout SECONDS]
kinds: ${Object.keys(KINDS).join(', ')}`);
    process.exit(2);
}

function parseArgs(argv) {
    const known = ['url', 'address', 'kind', 'id', 'size', 'count', 'script', 'timeout'];
    const opts = { size: String(2 * 1024 * 1024), count: '1', timeout: '30' };
    for (let i = 0; i < argv.length; i += 2) {
        const name = argv[i].replace(/^--/, '');
        if (!argv[i].startsWith('--') || !known.includes(name)) usage(`unknown argument ${argv[i]}`);
        if (argv[i + 1] === undefined) usage(`${argv[i]} needs a value`);
        opts[name] = argv[i + 1];
    }
    for (const name of ['url', 'address', 'kind', 'id']) {
        if (opts[name] === undefined) usage(`--${name} is required`);
    }
    if (!KINDS[opts.kind]) usage(`unknown kind ${opts.kind}`);
    for (const name of ['size', 'count', 'timeout']) {
        opts[name] = Number(opts[name]);
        if (!Number.isInteger(opts[name]) || opts[name] < (name === 'size' ? 0 : 1)) usage(`bad --${name}`);
    }
    return opts;
}

function connectOptions(url) {
    const u = new URL(url);
    if (u.protocol !== 'amqp:' && u.protocol !== 'amqps:') usage(`not an amqp:// or amqps:// URL: ${url}`);
    const tls = u.protocol === 'amqps:';
    const options = {
        host: u.hostname,
        port: Number(u.port) || (tls ? 5671 : 5672),
        transport: tls ? 'tls' : 'tcp',
        reconnect: false,
        // Without credentials: SASL ANONYMOUS (rhea picks it for a user without password).
        username: u.username ? decodeURIComponent(u.username) : 'anonymous',
    };
    if (u.password) options.password = decodeURIComponent(u.password);
    return options;
}

function build(opts, id) {
    const { props = {}, body = hello() } = KINDS[opts.kind](opts.size);
    if (opts.script !== undefined) props.script = opts.script;
    const msg = { message_id: id, durable: true, body };
    if (Object.keys(props).length) msg.application_properties = props;
    return msg;
}

const opts = parseArgs(process.argv.slice(2));
const ids = opts.count === 1 ? [opts.id] : Array.from({ length: opts.count }, (_, i) => `${opts.id}-${i}`);
const container = rhea.create_container();
let sent = 0, settled = 0, allAccepted = true;

function fail(what, error) {
    console.error(`publish.mjs: ${what}: ${error ? (error.description || error.message || JSON.stringify(error)) : 'no detail'}`);
    process.exit(2);
}

const timer = setTimeout(() => fail('timed out', { message: `${settled} of ${ids.length} settled after ${opts.timeout} s` }),
    opts.timeout * 1000);

function report(context, state) {
    const remote = context.delivery.remote_state;
    const error = remote && remote.error ? { condition: remote.error.condition, description: remote.error.description || null } : null;
    console.log(JSON.stringify({ id: context.delivery.wharf_id, state, error }));
    if (state !== 'accepted') allAccepted = false;
    if (++settled === ids.length) {
        clearTimeout(timer);
        context.connection.close();
    }
}

container.on('sendable', (context) => {
    while (sent < ids.length && context.sender.sendable()) {
        const id = ids[sent++];
        context.sender.send(build(opts, id)).wharf_id = id;
    }
});
for (const state of ['accepted', 'rejected', 'released', 'modified']) {
    container.on(state, (context) => report(context, state));
}
container.on('connection_close', () => process.exit(allAccepted && settled === ids.length ? 0 : 1));
container.on('connection_error', (context) => fail('connection error', context.connection.error || context.error));
container.on('session_error', (context) => fail('session error', context.session.error));
container.on('sender_error', (context) => fail('link error', context.sender.error));
container.on('disconnected', (context) => { if (settled < ids.length) fail('disconnected', context.error); });
container.on('error', (error) => fail('error', error));

const connection = container.connect(connectOptions(opts.url));
// Settle mode unsettled (the default): the broker sends a disposition for each delivery.
connection.open_sender({ target: { address: opts.address } });
