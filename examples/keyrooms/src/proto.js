// The wire contract, read at run time from the repository's proto/ (nothing generated, nothing copied): this
// server is built from proto/limen/env/v1/env.proto alone.
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import * as protoLoader from '@grpc/proto-loader';

export const PROTO_ROOT = fileURLToPath(new URL('../../../proto/', import.meta.url));
export const ENV_PROTO = 'limen/env/v1/env.proto';
export const ENV_SERVICE = 'limen.env.v1.EnvService';

/** env.proto's package definition: snake_case fields as written, int64 as strings (a seed may exceed 2^53),
 *  bytes as Buffers, defaults filled in, and the oneof's name (EpisodeRequest.request) set. */
export function loadEnvProto(root = PROTO_ROOT) {
  return protoLoader.loadSync(ENV_PROTO, {
    includeDirs: [path.resolve(root)], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
}
