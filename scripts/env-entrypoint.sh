#!/bin/sh
# Env-server container entrypoint. Fills the data folders first when LIMEN_FETCH_DATA names datasets
# ("alfworld,webshop"), falls back to built-in data when a folder holds none, then starts the server on
# every interface with the given arguments. `limen-entrypoint fetch-data` only fetches (init containers).
set -eu

for dataset in $(printf '%s' "${LIMEN_FETCH_DATA:-}" | tr ',' ' '); do
  limen-data fetch "$dataset"  # into $ALFWORLD_DATA / $WEBSHOP_DATA; a complete folder is left alone
done
if [ "${1:-}" = "fetch-data" ]; then
  exit 0
fi

# Games generated at image build seed the writable cache, so a new pod serves them at once.
if [ -d "${LIMEN_CACHE_SEED:-}" ] && [ ! -e "${LIMEN_CACHE:?LIMEN_CACHE_SEED needs LIMEN_CACHE}/alfworld" ]; then
  mkdir -p "$LIMEN_CACHE" && cp -R "$LIMEN_CACHE_SEED/." "$LIMEN_CACHE/"
fi

# An empty mount (a fresh volume, an unfilled PVC) means "no data", not "broken data": unset the variable so
# alfworld serves generated games and webshop its synthetic catalog, and say so.
if [ -n "${ALFWORLD_DATA:-}" ] && [ ! -d "$ALFWORLD_DATA/json_2.1.1" ]; then
  echo "limen-entrypoint: no json_2.1.1 in ALFWORLD_DATA=$ALFWORLD_DATA; alfworld serves generated games" >&2
  unset ALFWORLD_DATA
fi
if [ -n "${WEBSHOP_DATA:-}" ] && [ ! -f "$WEBSHOP_DATA/items_shuffle_1000.json" ]; then
  echo "limen-entrypoint: no items_shuffle_1000.json in WEBSHOP_DATA=$WEBSHOP_DATA; webshop serves its synthetic catalog" >&2
  unset WEBSHOP_DATA
fi

exec limen-env-server --host 0.0.0.0 "$@"
