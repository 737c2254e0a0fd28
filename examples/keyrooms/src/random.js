// Seeded randomness that every machine repeats: task generation and per-episode shuffles must not depend on
// Math.random, the Node version or the process, so a task id means the same world everywhere.
import { createHash } from 'node:crypto';

/** sha256 of `text`, hex. */
export function sha256Hex(text) {
  return createHash('sha256').update(text).digest('hex');
}

/**
 * A generator seeded by any string (mulberry32 over the first 4 bytes of its sha256).
 * @param {string} seedText
 * @returns {() => number} uniform floats in [0, 1)
 */
export function seededRandom(seedText) {
  let state = createHash('sha256').update(seedText).digest().readUInt32BE(0);
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [low, high], both ends included. */
export function randomInt(random, low, high) {
  return low + Math.floor(random() * (high - low + 1));
}

/** `count` distinct items of `items`, in random order. */
export function sample(random, items, count) {
  return shuffled(random, items).slice(0, count);
}

/** A shuffled copy (Fisher-Yates). */
export function shuffled(random, items) {
  const copy = [...items];
  for (let i = copy.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [copy[i], copy[j]] = [copy[j], copy[i]];
  }
  return copy;
}
