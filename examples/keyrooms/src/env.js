// The keyrooms env behind the session table: checks a reset's names against the catalog and turns the game's
// answers into the fields of a limen transition.

import { status } from '@grpc/grpc-js';

import { Catalog, DEFAULT_MAX_TURNS, ENV_NAME, Episode, instructionOf } from './game.js';
import { Refusal } from './sessions.js';

export class KeyroomsEnv {
  constructor() {
    this.catalog = new Catalog();
    this.name = ENV_NAME;
  }

  /** The task a reset names, or NOT_FOUND naming what is unknown. */
  task(env, split, taskId) {
    const tasks = this.tasks(env, split);
    const task = tasks.get(taskId);
    if (!task) throw new Refusal(status.NOT_FOUND, `no task ${JSON.stringify(taskId)} in ${ENV_NAME}/${split}`);
    return task;
  }

  /** A split's tasks, or NOT_FOUND naming the env or the split that is unknown. */
  tasks(env, split) {
    if (env !== ENV_NAME) throw new Refusal(status.NOT_FOUND, `env ${JSON.stringify(env)} is not served here; this server serves ${ENV_NAME}`);
    const tasks = this.catalog.splits.get(split);
    if (!tasks) {
      throw new Refusal(status.NOT_FOUND, `${ENV_NAME} has no split ${JSON.stringify(split)}; it has ${[...this.catalog.splits.keys()].join(', ')}`);
    }
    return tasks;
  }

  /** A new episode for a session spec (see sessions.js EpisodeSpec); refuses what the game cannot play. */
  open(spec) {
    const task = this.task(spec.env, spec.split, spec.taskId);
    if (Object.keys(spec.options).length) {
      throw new Refusal(status.INVALID_ARGUMENT, `${ENV_NAME} reads no reset options (keys it reads: none); got ${Object.keys(spec.options).join(', ')}`);
    }
    return { episode: new PlayedEpisode(task, spec.seed), maxTurns: spec.maxTurns || DEFAULT_MAX_TURNS };
  }
}

/** One episode as the session table drives it: reset(), then step(action, lastTurn). */
class PlayedEpisode {
  constructor(task, seed) {
    this.task = task;
    this.game = new Episode(task, seed);
  }

  reset() {
    return this.outcome(this.game.start(), false);
  }

  /** One turn; `lastTurn`: the turn limit ends the episode here unless the game itself does. */
  step(action, lastTurn) {
    return this.outcome(this.game.act(action), lastTurn && !this.game.won);
  }

  outcome(observation, truncated) {
    const won = this.game.won;
    const over = won || truncated;
    return {
      observation,
      admissible_actions: this.game.admissibleActions(),
      reward: won ? 1 : 0,
      terminated: won,
      truncated,
      won,
      score: won ? 1 : 0,
      task_id: this.task.taskId,
      task_category: this.task.category,
      instruction: instructionOf(this.task),
      // The expert's next action, as every limen env gives it (the trainer's SFT plays it); none once it is over.
      info: over ? {} : { expert_action: this.game.expertAction() },
    };
  }
}
