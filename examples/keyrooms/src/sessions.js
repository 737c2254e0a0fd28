// The session table: live episodes (which take capacity), finished ones kept a while for retries of their last
// step, step_index idempotency, episode_id idempotency, and drain. No gRPC here beyond the status codes that
// its refusals carry.

import { randomBytes } from 'node:crypto';
import { status } from '@grpc/grpc-js';

/** A refusal with the gRPC status code the service answers it with. */
export class Refusal extends Error {
  /** @param {number} code a grpc status code @param {string} message */
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// Ids of released sessions remembered with the reason, so that a late caller learns why it got NOT_FOUND.
const REMEMBERED_ENDINGS = 4096;

/**
 * @typedef {{ env: string, split: string, taskId: string, seed: string, maxTurns: number, episodeId: string,
 *             options: Record<string, string> }} EpisodeSpec
 * @typedef {{ observation: string, admissible_actions: string[], reward: number, terminated: boolean,
 *             truncated: boolean, won: boolean, score: number, info: Record<string, string> }} Outcome
 */

class Session {
  constructor(id, spec, episode, maxTurns, now) {
    this.id = id;
    this.spec = spec;
    this.episode = episode;
    this.maxTurns = maxTurns;
    /** @type {object[]} transitions by step_index (0 = the reset) */
    this.transitions = [];
    /** @type {string[]} actions by step_index (index 0 unused) */
    this.actions = [''];
    this.touchedAt = now;
    this.finishedAt = null;
  }

  get over() {
    const last = this.transitions[this.transitions.length - 1];
    return last.terminated || last.truncated;
  }
}

export class SessionTable {
  /**
   * @param {{ capacity: number, idleTtlMs: number, finishedGraceMs: number, maxFinished: number,
   *           serverId: string, clock?: () => number }} settings
   * @param {(spec: EpisodeSpec) => { episode: object, maxTurns: number }} openEpisode checks the spec (throws
   *        a Refusal) and returns the env's episode and its turn limit
   * @param {(session: Session, outcome: Outcome, stepIndex?: number) => object} transitionOf the wire transition
   *        of the session's step `stepIndex` (0: its reset)
   */
  constructor(settings, openEpisode, transitionOf) {
    this.settings = settings;
    this.clock = settings.clock ?? Date.now;
    this.openEpisode = openEpisode;
    this.transitionOf = transitionOf;
    /** @type {Map<string, Session>} live sessions, least recently touched first (touch moves one to the end) */
    this.live = new Map();
    /** @type {Map<string, Session>} finished sessions, oldest finish first */
    this.finished = new Map();
    /** @type {Map<string, Session>} */
    this.byEpisodeId = new Map();
    /** @type {Map<string, string>} released id -> why */
    this.endings = new Map();
    this.draining = false;
    this.episodesServed = 0;
    this.listeners = new Set();
  }

  /** Calls `listener()` after every change of the live count or of draining (readiness follows it). */
  onChange(listener) {
    this.listeners.add(listener);
  }

  changed() {
    for (const listener of this.listeners) listener();
  }

  get ready() {
    return !this.draining && this.live.size < this.settings.capacity;
  }

  /** The session for `spec`: the living one its episode_id names (a retried Reset), else a new one. */
  open(spec) {
    const known = spec.episodeId && this.byEpisodeId.get(spec.episodeId);
    if (known) {
      if (!sameSpec(known.spec, spec)) {
        throw new Refusal(status.INVALID_ARGUMENT, `episode_id ${JSON.stringify(spec.episodeId)} is already in use by `
          + `session ${known.id} with a different env/split/task/seed/max_turns/options`);
      }
      if (known.over) {
        // Its first Transition would say the episode goes on; a new episode needs a new id.
        throw new Refusal(status.FAILED_PRECONDITION, `episode_id ${JSON.stringify(spec.episodeId)} (session ${known.id}) `
          + `ended at step ${known.transitions.length - 1}; a new episode needs a new episode_id`);
      }
      this.touch(known);
      return known;
    }
    if (this.draining) throw new Refusal(status.UNAVAILABLE, 'the server is draining and opens no new sessions; try another server');
    if (this.live.size >= this.settings.capacity) {
      throw new Refusal(status.RESOURCE_EXHAUSTED, `all ${this.settings.capacity} session slots are taken; try another server or later`);
    }
    const { episode, maxTurns } = this.openEpisode(spec);
    const session = new Session(`${this.settings.serverId}-${randomBytes(8).toString('hex')}`, spec, episode, maxTurns,
      this.clock());
    session.transitions.push(this.transitionOf(session, episode.reset()));
    this.live.set(session.id, session);
    if (spec.episodeId) this.byEpisodeId.set(spec.episodeId, session);
    this.episodesServed += 1;
    this.changed();
    return session;
  }

  /** The session, live or finished; NOT_FOUND with the reason otherwise. */
  get(sessionId) {
    const session = this.live.get(sessionId) ?? this.finished.get(sessionId);
    if (!session) {
      throw new Refusal(status.NOT_FOUND, this.endings.get(sessionId) ?? `no session ${JSON.stringify(sessionId)} on this server`);
    }
    return session;
  }

  /**
   * Step `stepIndex` (counting from 1) with `action`. A step_index already applied with the same action returns
   * the stored transition; with another action, or one that skips ahead, it is INVALID_ARGUMENT and nothing
   * changes; the next step of an ended episode is FAILED_PRECONDITION.
   */
  step(sessionId, stepIndex, action) {
    const session = this.get(sessionId);
    this.touch(session);
    if (stepIndex < 1) throw new Refusal(status.INVALID_ARGUMENT, `step_index counts from 1, got ${stepIndex}`);
    const applied = session.transitions.length - 1;
    if (stepIndex <= applied) {
      if (session.actions[stepIndex] !== action) {
        throw new Refusal(status.INVALID_ARGUMENT, `step_index ${stepIndex} was applied with another action: `
          + 'a retry must resend the same action');
      }
      return session.transitions[stepIndex];
    }
    if (stepIndex > applied + 1) {
      throw new Refusal(status.INVALID_ARGUMENT, `step_index ${stepIndex} skips ahead: the next one is ${applied + 1}`);
    }
    if (session.over) {
      throw new Refusal(status.FAILED_PRECONDITION, `the episode of session ${session.id} is over (step ${applied} ended it)`);
    }
    const outcome = session.episode.step(action, stepIndex >= session.maxTurns);
    const transition = this.transitionOf(session, outcome, stepIndex);
    session.transitions.push(transition);
    session.actions.push(action);
    if (session.over) this.finish(session);
    return transition;
  }

  /** Ends a session at the client's request (Close, or its Episode stream ending). */
  close(sessionId, why = 'closed by the client') {
    this.release(this.get(sessionId), why);
  }

  touch(session) {
    session.touchedAt = this.clock();
    if (this.live.delete(session.id)) this.live.set(session.id, session);
  }

  /** A finished episode holds no slot; it is kept for retries of its last step for a while. */
  finish(session) {
    this.live.delete(session.id);
    session.finishedAt = this.clock();
    this.finished.set(session.id, session);
    while (this.finished.size > this.settings.maxFinished) {
      this.release(this.finished.values().next().value, 'finished and released (too many finished sessions kept)');
    }
    this.changed();
  }

  release(session, why) {
    const wasLive = this.live.delete(session.id);
    this.finished.delete(session.id);
    if (this.byEpisodeId.get(session.spec.episodeId) === session) this.byEpisodeId.delete(session.spec.episodeId);
    this.endings.set(session.id, `session ${session.id} is gone: ${why}`);
    if (this.endings.size > REMEMBERED_ENDINGS) this.endings.delete(this.endings.keys().next().value);
    if (wasLive) this.changed();
  }

  /** Releases idle live sessions and finished ones past their grace. Both maps are in time order, so each
   *  sweep stops at the first session that stays: its cost is what it releases, not what the table holds. */
  sweep() {
    const now = this.clock();
    for (const session of this.live.values()) {
      if (now - session.touchedAt < this.settings.idleTtlMs) break;
      this.release(session, `idle for ${this.settings.idleTtlMs / 1000} s`);
    }
    for (const session of this.finished.values()) {
      if (now - session.finishedAt < this.settings.finishedGraceMs) break;
      this.release(session, `finished and released after ${this.settings.finishedGraceMs / 1000} s`);
    }
  }

  startDraining() {
    this.draining = true;
    this.changed();
  }
}

function sameSpec(a, b) {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(spec) {
  const options = Object.keys(spec.options).sort().map((key) => [key, spec.options[key]]);
  return [spec.env, spec.split, spec.taskId, spec.seed, spec.maxTurns, options];
}
