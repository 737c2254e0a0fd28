"""A local stand-in for a vLLM OpenAI-compatible server in dev mode: the routes RemoteBackend uses, served over
real HTTP (werkzeug) by the TransformersBackend on a tiny model.

It follows vLLM 0.32's request and response shapes for those routes. It bans the reserved ids as a server
started with limen's logits processor does, or, with `ban_reserved=False`, samples over every output row as
a server started without it would. It can fail its first N completions with 503, to exercise retries.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import torch
from flask import Flask, abort, jsonify, request
from safetensors.torch import load_file
from werkzeug.serving import make_server

from trainer_client.policy import Policy, SamplingConfig, TransformersBackend, stop_token_ids

SERVED_MODEL = "limen-standin"


def standin_app(policy: Policy, fail_first: int = 0, ban_reserved: bool = True) -> Flask:
    # The server's own copy of the weights: it changes only through /collective_rpc, like a real server's.
    sampled_ids = policy.n_policy_tokens if ban_reserved else policy.output_weight.shape[0]
    backend = TransformersBackend(copy.deepcopy(policy.model), sampled_ids, stop_token_ids(policy.tokenizer),
                                  policy.tokenizer.pad_token_id, tokenizer=policy.tokenizer)
    lock = threading.Lock()     # one model, one request at a time (vLLM would batch them)
    state = {"failures_left": fail_first, "completions": 0, "reloads": 0}
    app = Flask("openai-standin")

    @app.get("/health")
    def health():
        return ""

    @app.get("/v1/models")
    def models():
        return jsonify({"object": "list", "data": [{"id": SERVED_MODEL, "object": "model"}]})

    @app.post("/v1/completions")
    def completions():
        with lock:
            if state["failures_left"] > 0:
                state["failures_left"] -= 1
                abort(503)
        body = request.get_json()
        if body.get("model") != SERVED_MODEL:
            abort(404, f"model {body.get('model')!r} does not exist")
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            abort(400, "this stand-in takes one token-id prompt per request")
        if body.get("logprobs") != 0 or not body.get("return_token_ids"):
            abort(400, "ask for logprobs=0 and return_token_ids")
        if body.get("stop") and not body.get("include_stop_str_in_output"):
            abort(400, "this stand-in keeps the stop string in the reply: ask for include_stop_str_in_output")
        sampling = SamplingConfig(max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                                  top_p=body["top_p"], seed=body.get("seed"), stop=tuple(body.get("stop") or ()))
        with lock:
            completion = backend.generate([prompt], sampling)[0]
            state["completions"] += 1
        return jsonify({
            "id": f"cmpl-{state['completions']}",
            "object": "text_completion",
            "model": SERVED_MODEL,
            "choices": [{
                "index": 0,
                "text": policy.tokenizer.decode(completion.token_ids),
                "token_ids": list(completion.token_ids),
                "logprobs": {"token_logprobs": list(completion.log_probs),
                             "tokens": [f"token_id:{t}" for t in completion.token_ids]},
                "finish_reason": completion.finish_reason,
            }],
        })

    @app.post("/collective_rpc")
    def collective_rpc():
        body = request.get_json()
        if body.get("method") != "reload_weights":
            abort(400, f"the stand-in runs only reload_weights, not {body.get('method')!r}")
        weights = load_file(Path(body["kwargs"]["weights_path"]) / "model.safetensors")
        with lock, torch.no_grad():
            backend.model.load_state_dict({k: v.to(backend.model.dtype) for k, v in weights.items()})
            state["reloads"] += 1
        return jsonify({"results": [None]})

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache():
        return jsonify({"success": True})

    app.config["standin_state"] = state
    app.config["standin_backend"] = backend
    return app


class StandinServer:
    """The app on 127.0.0.1 at a free port, in a thread: `with StandinServer(policy) as server: server.url`."""

    def __init__(self, policy: Policy, fail_first: int = 0, ban_reserved: bool = True) -> None:
        self.app = standin_app(policy, fail_first, ban_reserved)
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def state(self) -> dict:
        return self.app.config["standin_state"]

    @property
    def model(self):
        return self.app.config["standin_backend"].model

    def __enter__(self) -> StandinServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
