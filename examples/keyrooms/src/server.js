#!/usr/bin/env node
// The keyrooms env server: limen.env.v1.EnvService, grpc.health.v1 and reflection on one port.
//
//   node examples/keyrooms/src/server.js --port 50061 [--host 0.0.0.0] [--max-sessions 256]
//
// Settings come from flags (--help lists them); the bearer token from LIMEN_AUTH_TOKEN (or --auth-token). On
// SIGTERM or SIGINT it drains: readiness goes NOT_SERVING, new sessions get UNAVAILABLE, live episodes may finish
// for --drain-grace-s, then it stops.

import { randomBytes } from 'node:crypto';
import { readFileSync, realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import { ReflectionService } from '@grpc/reflection';
import { HealthImplementation } from 'grpc-health-check';

import { KeyroomsEnv } from './env.js';
import { ENV_SERVICE, loadEnvProto } from './proto.js';
import { EnvService, lenientService } from './service.js';
import { SessionTable } from './sessions.js';

const MIB = 1024 * 1024;
// flag -> [type, default, help]
const FLAGS = {
  host: ['string', '127.0.0.1', 'bind address; loopback unless another (0.0.0.0) is asked for'],
  port: ['string', '50051', 'gRPC port; 0 picks a free one (the listening line says which)'],
  'max-sessions': ['string', '256', 'live episodes held at once; a Reset beyond it gets RESOURCE_EXHAUSTED'],
  'idle-ttl-s': ['string', '600', 'a live session untouched this long is released; its id then answers NOT_FOUND'],
  'finished-grace-s': ['string', '60', 'a finished session is kept this long for retries of its last step'],
  'max-finished-sessions': ['string', '1024', 'finished sessions kept at most; the oldest is released first'],
  'max-action-bytes': ['string', '16384', 'longest action accepted, in UTF-8 bytes (INVALID_ARGUMENT beyond)'],
  'max-message-bytes': ['string', String(4 * MIB), 'gRPC message limit; above max-action-bytes, so that an '
    + 'oversize action gets the server\'s own INVALID_ARGUMENT'],
  'drain-grace-s': ['string', '30', 'after SIGTERM, how long live episodes may go on before the server stops'],
  'auth-token': ['string', '', 'bearer token every EnvService call must carry (health and reflection stay open); '
    + 'prefer the LIMEN_AUTH_TOKEN env var, which ps does not show'],
  'dry-run': ['boolean', false, 'print the resolved settings and exit'],
  help: ['boolean', false, 'show this help'],
};

function usage() {
  const lines = Object.entries(FLAGS).map(([name, [type, fallback, help]]) =>
    `  --${name}${type === 'string' ? ' VALUE' : ''}  ${help}${type === 'string' && fallback ? ` (default ${fallback})` : ''}`);
  return `usage: node examples/keyrooms/src/server.js [flags]\n${lines.join('\n')}\n`;
}

/** The settings from argv and the environment; throws with a one-line reason on a bad flag or value. */
export function settingsFrom(argv, environment = process.env) {
  const options = Object.fromEntries(Object.entries(FLAGS).map(([name, [type, fallback]]) => [name, { type, default: fallback }]));
  const { values } = parseArgs({ args: argv, options, strict: true, allowPositionals: false });
  const number = (name, { min = 1, integer = true } = {}) => {
    const value = Number(values[name]);
    if (!Number.isFinite(value) || value < min || (integer && !Number.isInteger(value))) {
      throw new Error(`--${name}: expected ${integer ? 'an integer' : 'a number'} >= ${min}, got ${JSON.stringify(values[name])}`);
    }
    return value;
  };
  const settings = {
    host: values.host,
    port: number('port', { min: 0 }),
    capacity: number('max-sessions'),
    idleTtlMs: number('idle-ttl-s', { integer: false }) * 1000,
    finishedGraceMs: number('finished-grace-s', { min: 0, integer: false }) * 1000,
    maxFinished: number('max-finished-sessions', { min: 0 }),
    maxActionBytes: number('max-action-bytes'),
    maxMessageBytes: number('max-message-bytes'),
    drainGraceMs: number('drain-grace-s', { min: 0, integer: false }) * 1000,
    authToken: values['auth-token'] || environment.LIMEN_AUTH_TOKEN || '',
    dryRun: values['dry-run'],
    help: values.help,
  };
  if (settings.port > 65535) throw new Error(`--port: out of range: ${settings.port}`);
  if (settings.maxMessageBytes <= settings.maxActionBytes) throw new Error('--max-message-bytes must exceed --max-action-bytes');
  return settings;
}

function serverVersion() {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  return `${pkg.name} ${pkg.version} (node ${process.version})`;
}

/** Starts the server; resolves to { address, port, stop(), drain() } once it listens. */
export async function serve(settings) {
  const serverId = `keyrooms-${randomBytes(4).toString('hex')}`;
  const env = new KeyroomsEnv();
  let service;
  const table = new SessionTable({ ...settings, serverId }, (spec) => env.open(spec),
    (session, outcome, stepIndex) => service.transition(session, outcome, stepIndex));
  service = new EnvService(env, table, { ...settings, serverVersion: serverVersion(), serverId });

  const definition = loadEnvProto();
  const server = new grpc.Server({
    'grpc.max_receive_message_length': settings.maxMessageBytes,
    'grpc.max_send_message_length': settings.maxMessageBytes,
    // Ping quiet clients, so that a vanished trainer's Episode streams end and free their slots.
    'grpc.keepalive_time_ms': 60_000,
    'grpc.keepalive_timeout_ms': 20_000,
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 10_000,
  });
  server.addService(lenientService(definition[ENV_SERVICE]), service.handlers());
  // Liveness "" is SERVING while the process runs; readiness (the service's name) while a Reset would be taken.
  const health = new HealthImplementation({ '': 'SERVING', [ENV_SERVICE]: 'SERVING' });
  health.addToServer(server);
  table.onChange(() => health.setStatus(ENV_SERVICE, table.ready ? 'SERVING' : 'NOT_SERVING'));
  new ReflectionService(definition).addToServer(server);

  const bindHost = settings.host.includes(':') ? `[${settings.host}]` : settings.host;
  const port = await new Promise((resolve, reject) => server.bindAsync(`${bindHost}:${settings.port}`,
    grpc.ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))));
  const sweeper = setInterval(() => table.sweep(), 1000);
  sweeper.unref();

  const stop = () => new Promise((resolve) => {
    clearInterval(sweeper);
    server.tryShutdown(() => resolve());
    setTimeout(() => { server.forceShutdown(); resolve(); }, 5000).unref();
  });
  const drain = async () => {
    table.startDraining();
    const deadline = Date.now() + settings.drainGraceMs;
    while (table.live.size > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 200));
    await stop();
  };
  const connectHost = ['0.0.0.0', '::', ''].includes(settings.host) ? '127.0.0.1' : bindHost;
  return { address: `${connectHost}:${port}`, port, serverId, stop, drain };
}

async function main(argv) {
  let settings;
  try {
    settings = settingsFrom(argv);
  } catch (error) {
    process.stderr.write(`keyrooms server: error: ${error.message} (--help lists the flags)\n`);
    return 2;
  }
  if (settings.help) {
    process.stdout.write(usage());
    return 0;
  }
  if (settings.dryRun) {
    process.stdout.write(`${JSON.stringify({ ...settings, authToken: settings.authToken ? '<set>' : '' }, null, 2)}\n`);
    return 0;
  }
  const running = await serve(settings);
  const loopback = ['127.0.0.1', 'localhost', '::1'].includes(settings.host);
  if (!loopback && !settings.authToken) {
    console.error(`keyrooms server: serving ${settings.host} without a bearer token: anyone who reaches this port can run episodes`);
  }
  // Tests and scripts read this line for the port (with --port 0).
  console.log(`keyrooms env server listening on ${running.address} (server_id ${running.serverId}; `
    + `auth ${settings.authToken ? 'bearer' : 'off'})`);
  await new Promise((resolve) => {
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
  console.log('keyrooms env server: draining');
  await running.drain();
  console.log('keyrooms env server: stopped');
  return 0;
}

// Run as a program (not imported by a test).
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main(process.argv.slice(2));
}
