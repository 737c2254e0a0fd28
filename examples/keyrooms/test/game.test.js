// The game alone, without gRPC: every task is winnable by its expert within the default turn limit, the same
// task and seed replay exactly, and the splits hold what ListEnvs will say they hold.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { CATEGORIES, Catalog, DEFAULT_MAX_TURNS, Episode, SPLIT_SIZES, instructionOf } from '../src/game.js';

const catalog = new Catalog();

function playExpert(task, seed) {
  const episode = new Episode(task, seed);
  const seen = [episode.start()];
  for (let turn = 0; turn < DEFAULT_MAX_TURNS && !episode.won; turn++) {
    const action = episode.expertAction();
    assert.ok(episode.admissibleActions().includes(action), `${task.taskId}: expert action ${action} is not listed`);
    seen.push(action, episode.act(action));
  }
  return { won: episode.won, seen };
}

test('the expert wins every task of every split within the default turn limit', () => {
  for (const tasks of catalog.splits.values()) {
    for (const task of tasks.values()) assert.ok(playExpert(task, '0').won, task.taskId);
  }
});

test('the same task and seed give the same episode; the seed only reorders the listed actions', () => {
  const task = catalog.splits.get('test').get('two-locks-002');
  assert.deepEqual(playExpert(task, '7'), playExpert(task, '7'));
  const orders = new Set(['1', '2', '3', '4'].map((seed) => new Episode(task, seed).admissibleActions().join('|')));
  assert.ok(orders.size > 1);
  assert.deepEqual(new Set(new Episode(task, '1').admissibleActions()), new Set(new Episode(task, '2').admissibleActions()));
});

test('splits: sizes, categories in turn, keys named in the instruction, no world in both train and test', () => {
  for (const [split, size] of Object.entries(SPLIT_SIZES)) assert.equal(catalog.splits.get(split).size, size);
  const task = catalog.splits.get('train').get('two-locks-005');
  assert.equal(task.category, CATEGORIES[2]);
  assert.match(instructionOf(task), /^open the chest in the \w+; the \w+ key is in the \w+, the \w+ key is in the \w+$/);
  const world = (t) => JSON.stringify([t.rooms, t.start, t.chest, t.doors, t.keys]);
  const train = new Set([...catalog.splits.get('train').values()].map(world));
  assert.equal(train.size, SPLIT_SIZES.train);
  assert.deepEqual([...catalog.splits.get('test').values()].filter((t) => train.has(world(t))), []);
});

test('a locked door holds until its key unlocks it; unknown actions change nothing', () => {
  const task = [...catalog.splits.get('test').values()].find((t) => t.doors.length === 1 && t.keys[0].room !== t.start);
  const episode = new Episode(task, '0');
  const before = episode.start();
  assert.match(episode.act('dance wildly'), /^Nothing happens\./);
  assert.equal(episode.act('look').replace('You look around.', ''), before.replace(/^Your task is to: [^.]*\./, ''));
  assert.equal(episode.won, false);
});

test('going past either end of the line changes nothing', () => {
  const task = [...catalog.splits.get('test').values()].find((t) => t.start === 0);
  const episode = new Episode(task, '0');
  const before = episode.start();
  assert.match(episode.act('go west'), /^Nothing happens\. You are in the /);
  assert.equal(episode.room, 0);
  assert.ok(before.includes(`You are in the ${task.rooms[0]}.`));
});
