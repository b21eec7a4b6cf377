#!/usr/bin/env node
// Builds the handler project in the current directory into a wharf component.
//
//   node wharf/build.mjs [-o OUT.wasm] [--engine starlingmonkey|quickjs]
//                        [--grants clocks,random,http] [ENTRY]
//
// ENTRY defaults to package.json "main" (else handler.js), OUT to
// "<package name>.wasm", the engine to package.json "wharf.engine" (else
// starlingmonkey), the grants to "wharf.grants" (else none): the WASI the
// mount will grant, which StarlingMonkey may then use (without clocks it
// would read the clock on every call). The handler and everything it imports (the SDK, npm
// packages) is bundled into one ES module first: the engines resolve only
// relative imports, and only inside the project folder.

import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const ENGINES = ['starlingmonkey', 'quickjs'];
// What the mount may grant beyond computing on the delivery (see wharf.toml
// [grants]); StarlingMonkey keeps the engine features that use them.
const GRANTS = ['clocks', 'random', 'http'];
const SDK_DIR = dirname(fileURLToPath(import.meta.url));
const WIT_DIR = join(SDK_DIR, 'wit');
const PROJECT_DIR = process.cwd();

function fail(message) {
  console.error(`wharf build: ${message}`);
  process.exit(1);
}

const { values: args, positionals } = parseArgs({
  options: {
    output: { type: 'string', short: 'o' },
    engine: { type: 'string' },
    grants: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  },
  allowPositionals: true,
});
if (args.help) {
  console.log('usage: node wharf/build.mjs [-o OUT.wasm] [--engine starlingmonkey|quickjs] [--grants clocks,random,http] [ENTRY]');
  process.exit(0);
}

const manifestPath = join(PROJECT_DIR, 'package.json');
if (!existsSync(manifestPath)) fail(`no package.json in ${PROJECT_DIR}: run the build from the project folder`);
const manifest = JSON.parse(await readFile(manifestPath, 'utf8'));
const entry = resolve(positionals[0] ?? manifest.main ?? 'handler.js');
const output = resolve(args.output ?? `${(manifest.name ?? 'handler').replace(/^@.*\//, '')}.wasm`);
const engine = args.engine ?? manifest.wharf?.engine ?? 'starlingmonkey';
if (!ENGINES.includes(engine)) fail(`unknown engine "${engine}" (one of ${ENGINES.join(', ')})`);
const grants = args.grants !== undefined ? args.grants.split(',').filter(Boolean) : (manifest.wharf?.grants ?? []);
for (const grant of grants) {
  if (!GRANTS.includes(grant)) fail(`unknown grant "${grant}" (one of ${GRANTS.join(', ')})`);
}
if (!existsSync(entry)) fail(`no handler source at ${entry}`);

// Tools come from the project's node_modules, also when this file is reached
// through a symlink from elsewhere.
const projectRequire = createRequire(manifestPath);

async function importFromProject(name) {
  for (let dir = PROJECT_DIR; ; dir = dirname(dir)) {
    const pkgDir = join(dir, 'node_modules', name);
    if (existsSync(join(pkgDir, 'package.json'))) {
      const pkg = JSON.parse(await readFile(join(pkgDir, 'package.json'), 'utf8'));
      const main = pkg.exports?.import ?? pkg.exports?.['.']?.import ?? pkg.module ?? pkg.main ?? 'index.js';
      return import(pathToFileURL(join(pkgDir, typeof main === 'string' ? main : main.default)));
    }
    if (dirname(dir) === dir) fail(`${name} is not installed: run \`npm install\` first`);
  }
}

const started = Date.now();
const workDir = await mkdtemp(join(tmpdir(), 'wharf-js-'));
try {
  const esbuild = projectRequire('esbuild');
  const bundled = join(workDir, 'handler.js');
  await esbuild.build({
    entryPoints: [entry],
    outfile: bundled,
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    mainFields: ['module', 'main'],
    alias: { wharf: join(SDK_DIR, 'wharf.js') },
    external: ['wharf:*', 'wasi:*'],
    define: { __WHARF_ENGINE__: JSON.stringify(engine), __WHARF_GRANTS__: JSON.stringify(grants) },
    logLevel: 'warning',
  });

  let component;
  if (engine === 'quickjs') {
    const { componentize } = projectRequire('componentize-qjs');
    // --sync: wharf calls `handle` without the component-model async ABI.
    ({ component } = await componentize({
      witPath: WIT_DIR,
      world: 'handler',
      jsSource: await readFile(bundled, 'utf8'),
      jsPath: bundled,
      sync: true,
    }));
  } else {
    const { componentize } = await importFromProject('@bytecodealliance/componentize-js');
    // Clocks, random and `fetch` (wasi:http) only when granted; never the
    // incoming-HTTP handler. Never AOT (weval would be downloaded at build time).
    const disabled = ['fetch-event', ...GRANTS.filter((g) => !grants.includes(g))];
    ({ component } = await componentize({
      sourcePath: bundled,
      witPath: WIT_DIR,
      worldName: 'handler',
      disableFeatures: disabled,
    }));
  }
  await writeFile(output, component);
  const kib = Math.round(component.length / 1024);
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const using = grants.length ? `, grants ${grants.join(',')}` : '';
  console.log(`${output}: ${kib} KiB (${engine}${using}, ${seconds} s)`);
} catch (e) {
  fail(e?.message ?? String(e));
} finally {
  await rm(workDir, { recursive: true, force: true });
}
