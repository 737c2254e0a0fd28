// keyrooms: a small text game of rooms, locked doors and keys, with one reward at the very end.
//
// The rooms of a task lie on a line from west to east. The chest sits in one room; up to two doors on the way
// are locked, each with a coloured key that lies somewhere the agent can reach before unlocking anything. The
// agent wins by opening the chest. Every observation says which way the chest and the keys still on the floor
// are, so everything the expert decides from (those directions, what it carries, which neighbouring door is
// locked) is in the current observation, and a small learner can match it.

import { randomInt, sample, seededRandom, sha256Hex, shuffled } from './random.js';

export const ENV_NAME = 'keyrooms';
export const CODE_VERSION = 'keyrooms-2';
export const DEFAULT_MAX_TURNS = 20;
export const ROOMS = ['cellar', 'hall', 'kitchen', 'library', 'study', 'gallery', 'tower', 'vault'];
export const COLORS = ['red', 'blue', 'green'];
export const TRINKETS = ['coin', 'candle', 'map', 'rope'];
// A task's category is how many doors on its way are locked.
export const CATEGORIES = ['no-lock', 'one-lock', 'two-locks'];
export const SPLIT_SIZES = { train: 480, test: 200 };
const SPLIT_DESCRIPTIONS = {
  train: 'keyrooms train = 480 generated tasks (seeded by the split name)',
  test: 'keyrooms test = 200 generated tasks (seeded by the split name), disjoint worlds from train',
};

/**
 * @typedef {{ at: number, color: string }} Door          the door between rooms[at] and rooms[at + 1]
 * @typedef {{ color: string, room: number }} KeyPlace
 * @typedef {{
 *   taskId: string, category: string, rooms: string[], start: number, chest: number,
 *   doors: Door[], keys: KeyPlace[], trinkets: { name: string, room: number }[]
 * }} Task
 */

/** Rooms from `from` to `to`, both included, in either direction. */
function between(from, to) {
  const step = to >= from ? 1 : -1;
  const rooms = [];
  for (let r = from; r !== to + step; r += step) rooms.push(r);
  return rooms;
}

/** One task with `locks` locked doors between its start and its chest. */
function makeTask(random, taskId, locks) {
  const present = new Set(sample(random, ROOMS, randomInt(random, 4, 6)));
  const rooms = ROOMS.filter((room) => present.has(room));
  let start;
  let chest;
  do {
    start = randomInt(random, 0, rooms.length - 1);
    chest = randomInt(random, 0, rooms.length - 1);
  } while (Math.abs(start - chest) < 2);
  const doorsOnTheWay = between(Math.min(start, chest), Math.max(start, chest) - 1);
  const lockedAt = sample(random, doorsOnTheWay, locks).sort((a, b) => a - b);
  const colors = sample(random, COLORS, locks);
  const doors = lockedAt.map((at, i) => ({ at, color: colors[i] }));
  // Every key lies on the start's side of the first locked door: reachable before anything is unlocked.
  const reachable = start < chest
    ? between(0, lockedAt.length ? lockedAt[0] : rooms.length - 1)
    : between(lockedAt.length ? lockedAt[lockedAt.length - 1] + 1 : 0, rooms.length - 1);
  const keys = doors.map((door) => ({ color: door.color, room: reachable[randomInt(random, 0, reachable.length - 1)] }));
  const trinkets = sample(random, TRINKETS, randomInt(random, 0, 2))
    .map((name) => ({ name, room: randomInt(random, 0, rooms.length - 1) }));
  return { taskId, category: CATEGORIES[locks], rooms, start, chest, doors, keys, trinkets };
}

/** What makes two tasks the same world (trinkets aside). */
function worldOf(task) {
  return JSON.stringify([task.rooms, task.start, task.chest, task.doors, task.keys]);
}

/** Every task of a split, in a stable order; seeded by the split name only. A world already in `taken` (an
 *  earlier split's, or this one's) is drawn again, so the test split holds worlds train never shows. */
function generateSplit(split, taken) {
  const random = seededRandom(`${CODE_VERSION}/${split}`);
  const tasks = [];
  for (let i = 0; i < SPLIT_SIZES[split]; i++) {
    const locks = i % CATEGORIES.length;
    let task;
    do task = makeTask(random, `${CATEGORIES[locks]}-${String(i).padStart(3, '0')}`, locks);
    while (taken.has(worldOf(task)));
    taken.add(worldOf(task));
    tasks.push(task);
  }
  return tasks;
}

/** The env's catalog: splits, tasks by id, and the version every transition carries. */
export class Catalog {
  constructor() {
    /** @type {Map<string, Map<string, Task>>} */
    const taken = new Set();
    this.splits = new Map(Object.keys(SPLIT_SIZES).map((split) => [
      split, new Map(generateSplit(split, taken).map((task) => [task.taskId, task]))]));
    // Generated data: the hash covers the generator's parameters (and its code version, which names the rules).
    this.dataHash = sha256Hex(JSON.stringify({ CODE_VERSION, ROOMS, COLORS, TRINKETS, CATEGORIES, SPLIT_SIZES }));
    this.version = `${CODE_VERSION}+${this.dataHash.slice(0, 12)}`;
  }

  /** What ListEnvs says about this env (plain fields of limen.env.v1.EnvInfo). */
  describe() {
    return {
      name: ENV_NAME,
      version: this.version,
      code_version: CODE_VERSION,
      data_hash: this.dataHash,
      default_max_turns: DEFAULT_MAX_TURNS,
      splits: [...this.splits].map(([name, tasks]) => {
        const perCategory = Object.fromEntries(CATEGORIES.map((c) => [c, 0]));
        for (const task of tasks.values()) perCategory[task.category] += 1;
        return {
          name, num_tasks: tasks.size, categories: CATEGORIES, tasks_per_category: perCategory, num_excluded: 0,
          description: SPLIT_DESCRIPTIONS[name],
        };
      }),
    };
  }
}

/** The task's goal, as the agent reads it (no final period: prompts add one). */
export function instructionOf(task) {
  const chest = `open the chest in the ${task.rooms[task.chest]}`;
  const keys = task.keys.map((key) => `the ${key.color} key is in the ${task.rooms[key.room]}`);
  return keys.length ? `${chest}; ${keys.join(', ')}` : chest;
}

/**
 * One episode of one task. `seed` only shuffles the order of the listed actions, as the other limen envs'
 * seeds do; the world itself is the task's.
 */
export class Episode {
  /** @param {Task} task @param {string} seed */
  constructor(task, seed) {
    this.task = task;
    this.random = seededRandom(`${task.taskId}/${seed}`);
    this.room = task.start;
    this.carried = new Set();
    /** @type {Map<string, number>} item ("red key", "coin") -> the room it lies in */
    this.floor = new Map([
      ...task.keys.map((key) => [`${key.color} key`, key.room]),
      ...task.trinkets.map((trinket) => [trinket.name, trinket.room]),
    ]);
    this.locked = new Map(task.doors.map((door) => [door.at, door.color]));
    this.won = false;
  }

  /** The first observation. */
  start() {
    return this.view(`Your task is to: ${instructionOf(this.task)}.`);
  }

  /** Applies one action (any text) and returns what the agent sees; won is set when the chest opens. */
  act(text) {
    const action = text.trim().toLowerCase().replace(/\s+/g, ' ');
    return this.view(this.feedback(action));
  }

  feedback(action) {
    const rooms = this.task.rooms;
    const go = action.match(/^go (east|west)$/);
    if (go) {
      const to = this.room + (go[1] === 'east' ? 1 : -1);
      if (to < 0 || to >= rooms.length) return 'Nothing happens.';
      const color = this.locked.get(Math.min(to, this.room));
      if (color) return `The ${color} door to the ${rooms[to]} is locked.`;
      this.room = to;
      return '';  // the view says where the agent now is
    }
    if (action.startsWith('take ')) {
      const item = action.slice(5);
      if (this.floor.get(item) !== this.room) return 'Nothing happens.';
      this.floor.delete(item);
      this.carried.add(item);
      return `You take the ${item}.`;
    }
    const unlock = action.match(/^unlock (\w+) door$/);
    if (unlock) {
      const door = this.adjacentLockedDoors().find((d) => d.color === unlock[1]);
      if (!door) return 'Nothing happens.';
      if (!this.carried.has(`${door.color} key`)) return `You have no ${door.color} key.`;
      this.locked.delete(door.at);
      return `You unlock the ${door.color} door.`;
    }
    if (action === 'open chest' && this.room === this.task.chest) {
      this.won = true;
      return 'You open the chest. The treasure is yours!';
    }
    if (action === 'look') return 'You look around.';
    return 'Nothing happens.';
  }

  /** @returns {Door[]} the locked doors next to the agent's room */
  adjacentLockedDoors() {
    return [this.room - 1, this.room].filter((at) => this.locked.has(at)).map((at) => ({ at, color: this.locked.get(at) }));
  }

  itemsHere() {
    return [...this.floor].filter(([, room]) => room === this.room).map(([item]) => item).sort();
  }

  neighbours() {
    return [this.room - 1, this.room + 1].filter((r) => r >= 0 && r < this.task.rooms.length);
  }

  /** feedback + where the agent is, what lies here, what it carries and where it can go. */
  view(feedback) {
    const rooms = this.task.rooms;
    const seen = [...(this.room === this.task.chest ? ['chest'] : []), ...this.itemsHere()];
    const exits = this.neighbours().map((to) => {
      const color = this.locked.get(Math.min(to, this.room));
      return `${directionOf(to - this.room)} (${rooms[to]}${color ? `, locked ${color} door` : ''})`;
    });
    const parts = [...(feedback ? [feedback] : []), `You are in the ${rooms[this.room]}.`];
    if (seen.length) parts.push(`You see: ${seen.join(', ')}.`);
    if (this.carried.size) parts.push(`You carry: ${[...this.carried].sort().join(', ')}.`);
    parts.push(`Exits: ${exits.join(', ')}.`);
    parts.push(...this.bearings());
    return parts.join(' ');
  }

  /** Which way the chest and every key still on the floor lie from here. */
  bearings() {
    const where = (room) => (room === this.room ? 'here' : directionOf(room - this.room));
    const keys = this.task.keys.filter((key) => this.floor.has(`${key.color} key`))
      .map((key) => `The ${key.color} key is ${where(this.floor.get(`${key.color} key`))}.`);
    return [`The chest is ${where(this.task.chest)}.`, ...keys];
  }

  /** Every action the game understands here, in an order the episode's seed shuffles. */
  admissibleActions() {
    const actions = [
      ...this.neighbours().map((to) => `go ${directionOf(to - this.room)}`),
      ...this.itemsHere().map((item) => `take ${item}`),
      ...this.adjacentLockedDoors().map((door) => `unlock ${door.color} door`),
      ...(this.room === this.task.chest ? ['open chest'] : []),
      'look',
    ];
    return shuffled(this.random, actions);
  }

  /** A shortest way to win from here: fetch the keys still on the floor (nearest first), then go to the chest,
   *  unlocking doors on the way, and open it. */
  expertAction() {
    const task = this.task;
    if (this.room === task.chest) return 'open chest';
    const missing = task.keys.filter((key) => !this.carried.has(`${key.color} key`));
    if (missing.length) {
      const nearest = missing.reduce((a, b) => (Math.abs(b.room - this.room) < Math.abs(a.room - this.room) ? b : a));
      return nearest.room === this.room ? `take ${nearest.color} key` : this.walkTowards(nearest.room);
    }
    const next = this.room + Math.sign(task.chest - this.room);
    const color = this.locked.get(Math.min(next, this.room));
    return color ? `unlock ${color} door` : `go ${directionOf(next - this.room)}`;
  }

  walkTowards(room) {
    return `go ${directionOf(room - this.room)}`;
  }
}

/** "east" for a positive offset along the line of rooms, "west" for a negative one. */
function directionOf(offset) {
  return offset > 0 ? 'east' : 'west';
}
