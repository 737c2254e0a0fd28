"""`limen-data fetch alfworld|webshop --to DIR`: download the public data, verify it, lay it out for the envs.

Each env declares its data beside its code (envs/<env>/dataset.py), found through registry.ENV_DATASETS.
Other installed packages add what else the command fetches through the `limen.data` entry points (pyproject.toml):
the trainer's pretrained models (`limen-data fetch smollm2`, trainer_client/pretrained.py), so this server-side
module never imports the trainer, and the env-server image, which has no trainer, lists none of them.

Downloads resume after an interruption (HTTP Range); anything that fails its sha256 is deleted and refused.
Content for which no hash is known is installed only with --allow-unverified (see docs/DEPLOY.md, "Data").
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from env_server import registry
from env_server.envs.datasets import Asset, Dataset

# Entry points of this group name what else `limen-data fetch NAME` fetches: each a callable
# (to: Path | None, force: bool) -> exit status.
FETCHER_GROUP = "limen.data"
MIRROR_ENV_VAR = "LIMEN_DATA_MIRROR"
MARKER_NAME = ".limen-data.json"  # written last: its presence means the folder holds a complete, checked fetch
_CHUNK_BYTES = 1 << 20


class DataError(Exception):
    """A fetch that cannot complete safely; the message says what to do."""


class ChecksumMismatch(DataError):
    """Downloaded or extracted bytes differ from the known sha256: corrupt or tampered."""


# ---- content digests (pure, apart from reading the files) -------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def tree_digest(file_hashes: Mapping[str, str]) -> str:
    """sha256 of a `sha256sum` listing ("<hex>  <relative path>" lines, sorted by path).

    The same number comes from `sha256sum FILES | LC_ALL=C sort -k2 | sha256sum`, so anyone can recompute it.
    """
    listing = "".join(f"{file_hashes[path]}  {path}\n" for path in sorted(file_hashes))
    return hashlib.sha256(listing.encode()).hexdigest()


def directory_digest(root: Path, files: Iterable[Path]) -> str:
    return tree_digest({path.relative_to(root).as_posix(): file_sha256(path) for path in files})


# ---- download -----------------------------------------------------------------------------------------


def asset_url(dataset: Dataset, asset: Asset, mirror: str | None) -> str:
    """A mirror holds every file flat under <mirror>/<dataset>/<filename>."""
    return f"{mirror.rstrip('/')}/{dataset.name}/{asset.filename}" if mirror else asset.url


def _resume_offset(response: httpx.Response, offset: int) -> int:
    """Where the body of `response` starts in the file: `offset` for a honoured Range, 0 for a full body."""
    if response.status_code == 206:
        content_range = response.headers.get("content-range", "")
        if not content_range.startswith(f"bytes {offset}-"):
            raise DataError(f"server answered Range bytes={offset}- with Content-Range {content_range!r}")
        return offset
    response.raise_for_status()
    return 0


def download(
    client: httpx.Client,
    url: str,
    dest: Path,
    expected_sha256: str | None,
    progress: Progress,
    attempts: int = 5,
    backoff_s: float = 0.5,
) -> str:
    """Fetch `url` into `dest` and return its sha256. Bytes land in `dest.part` first, so an interrupted
    transfer (this call's, or a killed earlier run's) continues from where it stopped."""
    if dest.exists():  # completed by an earlier run that failed on a later file
        actual = file_sha256(dest)
        if expected_sha256 in (None, actual):
            return actual
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    task = progress.add_task(dest.name, total=None)
    for attempt in range(1, attempts + 1):
        offset = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            with client.stream("GET", url, headers=headers) as response:
                if response.status_code == 416:  # nothing left to send: the part is already whole
                    break
                start = _resume_offset(response, offset)
                length = response.headers.get("content-length")
                progress.update(task, completed=start, total=start + int(length) if length else None)
                with part.open("ab" if start else "wb") as f:
                    for chunk in response.iter_bytes():  # no re-chunking: a buffered tail would be lost on a break
                        f.write(chunk)
                        progress.advance(task, len(chunk))
            break
        except httpx.TransportError as error:
            if attempt == attempts:
                raise DataError(f"{url}: gave up after {attempts} attempts ({error!r}); rerun to resume") from error
            progress.console.print(f"{dest.name}: transfer broke ({error!r}); resuming, attempt {attempt + 1}")
            time.sleep(backoff_s * attempt)
    actual = file_sha256(part)
    if expected_sha256 is not None and actual != expected_sha256:
        part.unlink()
        raise ChecksumMismatch(
            f"{dest.name}: sha256 {actual} != expected {expected_sha256}; "
            "the file was deleted (corrupt or changed upstream)"
        )
    part.replace(dest)
    return actual


# ---- install --------------------------------------------------------------------------------------------


def extract_zip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise DataError(f"{archive.name}: refusing member {name!r} outside the data folder")
        zf.extractall(into)


def check_splits(dataset: Dataset, staging: Path) -> tuple[list[str], list[str]]:
    """Verify every split that has a known digest. Returns (verified, unverified) split names."""
    if not dataset.split_root:
        return [], []
    root = staging / dataset.split_root
    present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    missing = sorted(set(dataset.split_digests) - set(present))
    if missing:
        raise DataError(f"{dataset.name}: the archives lack splits {missing} (found {present})")
    for split, expected in dataset.split_digests.items():
        actual = directory_digest(root / split, dataset.split_files(root / split))
        if actual != expected:
            raise ChecksumMismatch(f"{dataset.name}/{split}: content digest {actual} != expected {expected}")
    return sorted(dataset.split_digests), [split for split in present if split not in dataset.split_digests]


def read_marker(to: Path) -> dict | None:
    try:
        return json.loads((to / MARKER_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _download_assets(
    client: httpx.Client, dataset: Dataset, assets: list[Asset], downloads: Path, mirror: str | None, console: Console
) -> dict[str, str]:
    """Download every asset into `downloads`; returns filename -> sha256."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console) as progress:
        return {
            asset.filename: download(
                client, asset_url(dataset, asset, mirror), downloads / asset.filename, asset.sha256, progress
            )
            for asset in assets
        }


def _stage(dataset: Dataset, assets: list[Asset], downloads: Path, staging: Path) -> tuple[list[str], list[str]]:
    """Lay the downloads out in `staging` as the env expects them, then check the splits."""
    for asset in assets:
        path = downloads / asset.filename
        if asset.unpack:
            extract_zip(path, staging)
            path.unlink()
        else:
            path.replace(staging / asset.filename)
    return check_splits(dataset, staging)


def _install(staging: Path, to: Path) -> None:
    """Move every staged entry into `to`, replacing what an earlier fetch left there."""
    for entry in staging.iterdir():
        target = to / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        entry.replace(target)
    staging.rmdir()


def fetch(
    dataset: Dataset,
    to: Path,
    *,
    mirror: str | None = None,
    allow_unverified: bool = False,
    force: bool = False,
    client: httpx.Client | None = None,
    console: Console | None = None,
) -> dict:
    """Download, verify and install `dataset` into `to`; returns what the marker file records.

    Nothing reaches `to` before every check passed: files are staged in `to/.staging` and moved at the end.
    """
    console = console or Console(stderr=True)
    wanted = [a for a in dataset.assets if a.sha256 is not None or a.unpack or allow_unverified]
    skipped = [a.filename for a in dataset.assets if a not in wanted]
    marker = read_marker(to)
    complete = marker and marker["dataset"] == dataset.name and set(marker["files"]) == {a.filename for a in wanted}
    if complete and not force:
        console.print(f"{dataset.name}: already in {to} (see {MARKER_NAME}); --force fetches again")
        return marker

    downloads, staging = to / ".download", to / ".staging"
    downloads.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    own_client = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=120.0))
    try:
        hashes = _download_assets(client, dataset, wanted, downloads, mirror, console)
        verified, unverified = _stage(dataset, wanted, downloads, staging)
        if not allow_unverified:
            skipped += unverified
            for split in unverified:
                shutil.rmtree(staging / dataset.split_root / split)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if own_client:
            client.close()
    _install(staging, to)
    shutil.rmtree(downloads)

    record = {
        "dataset": dataset.name,
        "files": hashes,
        "unverified_files": [a.filename for a in wanted if a.sha256 is None and not a.unpack],
        "verified_splits": verified,
        "unverified_splits": unverified if allow_unverified else [],
        "skipped": skipped,
    }
    (to / MARKER_NAME).write_text(json.dumps(record, indent=2) + "\n")
    for name in skipped:
        console.print(f"{dataset.name}: left out {name} (no known sha256; --allow-unverified installs it)")
    return record


# ---- command line ---------------------------------------------------------------------------------------


def installed_fetchers() -> dict[str, metadata.EntryPoint]:
    """The fetchers other packages declare, those whose package is installed here (not loaded yet)."""
    return {entry.name: entry for entry in metadata.entry_points(group=FETCHER_GROUP)
            if importlib.util.find_spec(entry.module.partition(".")[0]) is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limen-data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = commands.add_parser("fetch", help="download, verify and install one dataset, or cache a pretrained model")
    fetch_cmd.add_argument("dataset", choices=sorted(registry.ENV_DATASETS) + sorted(installed_fetchers()))
    fetch_cmd.add_argument("--to", type=Path, help="target folder (default: $ALFWORLD_DATA or $WEBSHOP_DATA; "
                           "for a model, $LIMEN_CACHE/models/NAME or ~/.cache/limen/models/NAME)")
    fetch_cmd.add_argument(
        "--mirror",
        default=os.environ.get(MIRROR_ENV_VAR) or None,
        help=f"base URL serving <dataset>/<filename> instead of the upstream locations (env {MIRROR_ENV_VAR})",
    )
    fetch_cmd.add_argument(
        "--allow-unverified", action="store_true", help="also install content whose sha256 nobody published"
    )
    fetch_cmd.add_argument("--force", action="store_true", help="fetch again even if the folder is complete")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fetchers = installed_fetchers()
    if args.dataset in fetchers:
        return fetchers[args.dataset].load()(args.to, force=args.force)
    dataset = registry.dataset(args.dataset)
    to = args.to or (Path(os.environ[dataset.env_var]) if os.environ.get(dataset.env_var) else None)
    if to is None:
        print(f"limen-data: give --to DIR or set {dataset.env_var}", file=sys.stderr)
        return 2
    try:
        record = fetch(dataset, to, mirror=args.mirror, allow_unverified=args.allow_unverified, force=args.force)
    except (DataError, httpx.HTTPError, OSError) as error:
        print(f"limen-data: {error}", file=sys.stderr)
        return 1
    print(f"{dataset.name}: {len(record['files'])} files in {to}; set {dataset.env_var}={to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
