// limen.env.v1.EnvService over the session table: requests in, transitions out, every refusal a status code.

import { createHash, timingSafeEqual } from 'node:crypto';
import { status } from '@grpc/grpc-js';

import { Refusal } from './sessions.js';

/** A request whose bytes did not parse: answered INVALID_ARGUMENT by the handler (grpc-js alone says INTERNAL). */
class Malformed {
  constructor(reason) {
    this.reason = reason;
  }
}

/**
 * The EnvService definition with lenient request parsing: a request that does not decode reaches the handler
 * as a Malformed value instead of failing inside grpc-js.
 */
export function lenientService(definition) {
  return Object.fromEntries(Object.entries(definition).map(([name, method]) => [name, {
    ...method,
    requestDeserialize: (bytes) => {
      try {
        return method.requestDeserialize(bytes);
      } catch (error) {
        return new Malformed(`the ${name} request does not parse: ${error.message}`);
      }
    },
  }]));
}

function invalid(message) {
  return new Refusal(status.INVALID_ARGUMENT, message);
}

function asStatus(error) {
  if (error instanceof Refusal) return { code: error.code, details: error.message };
  console.error('keyrooms: unexpected error', error);
  return { code: status.INTERNAL, details: `internal error: ${error.message}` };
}

// Longest episode_id and options (keys and values together, UTF-8) a Reset may carry.
const MAX_EPISODE_ID_BYTES = 256;
const MAX_OPTIONS_BYTES = 4096;
// A Reset without an episode_id that finishes this close to its deadline is released, not answered: its answer
// would likely arrive too late, and nobody could then claim or close the session (env.proto, "Abandoned Resets").
const ABANDON_MARGIN_MS = 2;
const ABANDON_SHARE = 0.01;

/** The page token is the offset of the next page, in ASCII digits; anything else is refused. */
function pageStart(token, total) {
  if (!token) return 0;
  const offset = /^\d{1,9}$/.test(token) ? Number(token) : NaN;
  if (!(offset > 0 && offset < total)) throw invalid(`page_token ${JSON.stringify(token)} is not one this server issued`);
  return offset;
}

export class EnvService {
  /**
   * @param {import('./env.js').KeyroomsEnv} env
   * @param {import('./sessions.js').SessionTable} table
   * @param {{ authToken: string, maxActionBytes: number, serverVersion: string, serverId: string }} settings
   */
  constructor(env, table, settings) {
    this.env = env;
    this.table = table;
    this.settings = settings;
    this.expectedAuth = settings.authToken ? digest(`Bearer ${settings.authToken}`) : null;
  }

  /** The handlers grpc-js serves, each behind the token check and the malformed-request check. */
  handlers() {
    const unary = (handle) => (call, callback) => {
      try {
        this.admit(call.metadata, call.request);
        callback(null, handle(call.request));
      } catch (error) {
        callback(asStatus(error));
      }
    };
    return {
      ListEnvs: unary(() => this.listEnvs()),
      ListTasks: unary((request) => this.listTasks(request)),
      Reset: (call, callback) => this.reset(call, callback),
      Step: unary((request) => this.table.step(request.session_id, request.step_index, this.action(request.action))),
      Close: unary((request) => {
        this.table.close(request.session_id);
        return {};
      }),
      GetLoad: unary(() => this.load()),
      Episode: (call) => this.episode(call),
    };
  }

  /** A unary Reset; one without an episode_id is released rather than answered when it finishes so close to
   *  its deadline that the answer would likely be lost (nobody could claim or close that session). */
  reset(call, callback) {
    const arrived = Date.now();
    try {
      this.admit(call.metadata, call.request);
      const session = this.table.open(this.spec(call.request));
      const deadline = Number(call.getDeadline());
      const left = deadline - Date.now();
      if (!call.request.episode_id && Number.isFinite(deadline) && left < ABANDON_MARGIN_MS + ABANDON_SHARE * (deadline - arrived)) {
        this.table.close(session.id, 'its Reset finished too close to the deadline for the answer to arrive');
        throw new Refusal(status.DEADLINE_EXCEEDED, 'the reset finished too close to the call\'s deadline; retry with an episode_id');
      }
      callback(null, session.transitions[0]);
    } catch (error) {
      callback(asStatus(error));
    }
  }

  /** UNAUTHENTICATED without the bearer token (when one is set), then INVALID_ARGUMENT for unparsable bytes.
   *  The token goes first: an unauthenticated caller learns nothing, not even a parse error. */
  admit(metadata, request) {
    if (this.expectedAuth) {
      // More than one entry is refused too (which would count?), where it can be seen: Node's http2 keeps only the
      // first authorization header of a request, so here a second one never arrives.
      const sent = metadata.get('authorization');
      if (sent.length !== 1 || !timingSafeEqual(digest(String(sent[0])), this.expectedAuth)) {
        throw new Refusal(status.UNAUTHENTICATED, "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'");
      }
    }
    if (request instanceof Malformed) throw invalid(request.reason);
  }

  listEnvs() {
    return { envs: [this.env.catalog.describe()], server_version: this.settings.serverVersion };
  }

  listTasks(request) {
    const tasks = [...this.env.tasks(request.env, request.split).values()];
    if (request.page_size < 0) throw invalid(`page_size must be >= 0 (0 returns every id), got ${request.page_size}`);
    const start = pageStart(request.page_token, tasks.length);
    const end = request.page_size === 0 ? tasks.length : Math.min(tasks.length, start + request.page_size);
    const page = tasks.slice(start, end);
    return {
      task_ids: page.map((task) => task.taskId),
      tasks: page.map((task) => ({ task_id: task.taskId, category: task.category, excluded_reason: '' })),
      next_page_token: end < tasks.length ? String(end) : '',
    };
  }

  load() {
    const live = this.table.live.size;
    const rss = process.memoryUsage().rss;
    return {
      active_sessions: live,
      capacity: this.table.settings.capacity,
      draining: this.table.draining,
      worker_rss_bytes: rss,
      // One process steps every episode: it is the only worker.
      workers: [{ pid: process.pid, sessions: live, rss_bytes: rss, episodes_served: this.table.episodesServed }],
      sessions_by_env: live ? { [this.env.name]: live } : {},
      server_id: this.settings.serverId,
    };
  }

  /** A ResetRequest as the session table's EpisodeSpec; malformed values are INVALID_ARGUMENT. */
  spec(request) {
    if (!request.task_id) throw invalid('task_id must be set');
    if (request.max_turns < 0) throw invalid(`max_turns must be >= 0 (0 = the env's default), got ${request.max_turns}`);
    if (Buffer.byteLength(request.episode_id) > MAX_EPISODE_ID_BYTES) {
      throw invalid(`episode_id is ${Buffer.byteLength(request.episode_id)} bytes; at most ${MAX_EPISODE_ID_BYTES}`);
    }
    const optionBytes = Object.entries(request.options).reduce((sum, [k, v]) => sum + Buffer.byteLength(k) + Buffer.byteLength(v), 0);
    if (optionBytes > MAX_OPTIONS_BYTES) throw invalid(`options are ${optionBytes} bytes; at most ${MAX_OPTIONS_BYTES}`);
    this.env.task(request.env, request.split, request.task_id);
    return {
      env: request.env, split: request.split, taskId: request.task_id, seed: String(request.seed),
      maxTurns: request.max_turns, episodeId: request.episode_id, options: request.options,
    };
  }

  /** The action's text: at most maxActionBytes of valid UTF-8, else INVALID_ARGUMENT. */
  action(bytes) {
    if (bytes.length > this.settings.maxActionBytes) {
      throw invalid(`the action is ${bytes.length} bytes; this server accepts at most ${this.settings.maxActionBytes}`);
    }
    try {
      return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
    } catch {
      throw invalid('the action is not UTF-8');
    }
  }

  /** The wire transition of one step (0: the reset) of a session. */
  transition(session, outcome, stepIndex = 0) {
    const spec = session.spec;
    return {
      ...outcome, session_id: session.id, step_index: stepIndex, version: this.env.catalog.version, env: spec.env,
      split: spec.split, episode_id: spec.episodeId, seed: spec.seed,
    };
  }

  /** One episode per stream: a reset first, then steps (their session_id is ignored). The session ends with
   *  the stream, whichever side ends it; a refusal ends the stream with its status. */
  episode(call) {
    let session = null;
    let over = false;
    const release = (why) => {
      if (session && (this.table.live.has(session.id) || this.table.finished.has(session.id))) this.table.close(session.id, why);
    };
    const end = (error) => {
      if (over) return;
      over = true;
      release(error ? 'its Episode stream ended with an error' : 'its Episode stream ended');
      if (error) call.emit('error', asStatus(error));
      else call.end();
    };
    call.on('data', (message) => {
      if (over) return;
      try {
        this.admit(call.metadata, message);
        call.write(this.episodeMessage(message, session, (opened) => { session = opened; }));
      } catch (error) {
        end(error);
      }
    });
    call.on('end', () => end(null));
    call.on('cancelled', () => {
      over = true;
      release('the client cancelled its Episode stream');
    });
  }

  episodeMessage(message, session, opened) {
    if (message.request === 'reset') {
      if (session) throw invalid('an Episode stream carries one episode: one reset, first');
      const started = this.table.open(this.spec(message.reset));
      opened(started);
      return started.transitions[0];
    }
    if (message.request === 'step') {
      if (!session) throw new Refusal(status.FAILED_PRECONDITION, 'the first message of an Episode stream must be a reset');
      return this.table.step(session.id, message.step.step_index, this.action(message.step.action));
    }
    throw invalid('an EpisodeRequest must carry a reset or a step');
  }
}

function digest(text) {
  return createHash('sha256').update(text).digest();
}
