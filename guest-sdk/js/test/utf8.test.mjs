// The SDK's UTF-8 decoder (used where the engine has no TextDecoder) agrees
// with a strict TextDecoder: run with `node --test guest-sdk/js/test`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeUtf8 } from '../utf8.js';

const strict = new TextDecoder('utf-8', { fatal: true });
function expected(bytes) {
  try {
    return strict.decode(bytes);
  } catch {
    return null;
  }
}

const cases = [
  [],
  [0x00, 0x25, 0x32, 0x35, 0x7f], // NUL, "%25", DEL
  [0xc3, 0xa9], // é
  [0xe2, 0x82, 0xac], // €
  [0xf0, 0x9d, 0x84, 0x9e], // 𝄞, outside the BMP
  [0xf4, 0x8f, 0xbf, 0xbf], // U+10FFFF
  [0xc0, 0x80], // overlong NUL
  [0xe0, 0x80, 0x80], // overlong
  [0xf0, 0x80, 0x80, 0x80], // overlong
  [0xed, 0xa0, 0x80], // a surrogate
  [0xf4, 0x90, 0x80, 0x80], // past U+10FFFF
  [0xe2, 0x82], // truncated
  [0x80], // a lone continuation byte
  [0xff],
  [0xf5, 0x80, 0x80, 0x80],
];

test('known sequences decode as a strict TextDecoder does', () => {
  for (const bytes of cases) {
    const input = Uint8Array.from(bytes);
    assert.equal(decodeUtf8(input), expected(input), `bytes ${bytes.map((b) => b.toString(16))}`);
  }
});

test('random bytes and random text decode as a strict TextDecoder does', () => {
  let seed = 42;
  const next = () => (seed = (seed * 1103515245 + 12345) >>> 0) >>> 16;
  for (let round = 0; round < 2000; round++) {
    const length = next() % 64;
    let input;
    if (round % 2 === 0) {
      input = Uint8Array.from({ length }, () => next() & 0xff);
    } else {
      const text = Array.from({ length }, () => String.fromCodePoint(next() % 3 === 0 ? next() % 0x800 : 0x20 + (next() % 0x5f))).join('');
      input = new TextEncoder().encode(text);
    }
    assert.equal(decodeUtf8(input), expected(input));
  }
});

test('a body longer than one chunk of arguments decodes whole', () => {
  const text = 'é€𝄞%x'.repeat(5000);
  assert.equal(decodeUtf8(new TextEncoder().encode(text)), text);
});
