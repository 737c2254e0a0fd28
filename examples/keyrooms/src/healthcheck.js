#!/usr/bin/env node
// Exit 0 when the server's grpc.health.v1 check says SERVING, else 1 (the image's HEALTHCHECK, compose's too).
//
//   node examples/keyrooms/src/healthcheck.js --address 127.0.0.1:50051 [--service limen.env.v1.EnvService]
//
// The default service "" is liveness: a full or draining server is busy, not broken, so it stays healthy.

import { parseArgs } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import { service as healthService } from 'grpc-health-check';

const TIMEOUT_MS = 5000;

function check(address, serviceName) {
  const Client = grpc.makeGenericClientConstructor(healthService, 'Health');
  const client = new Client(address, grpc.credentials.createInsecure());
  return new Promise((resolve) => {
    client.check({ service: serviceName }, { deadline: Date.now() + TIMEOUT_MS }, (error, reply) => {
      client.close();
      resolve(error ? `error: ${error.message}` : reply.status);
    });
  });
}

const { values } = parseArgs({
  options: { address: { type: 'string', default: '127.0.0.1:50051' }, service: { type: 'string', default: '' },
    'dry-run': { type: 'boolean', default: false } },
  strict: true,
});
if (values['dry-run']) {
  console.log(JSON.stringify(values));
} else {
  const answer = await check(values.address, values.service);
  console.log(`${values.address} ${JSON.stringify(values.service)}: ${answer}`);
  process.exitCode = answer === 'SERVING' ? 0 : 1;
}
