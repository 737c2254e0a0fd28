"""Env-server targets: parse `host:port` and `dns:///name:port` entries and resolve them to addresses.

A `dns:///` target is looked up again on every `resolve`, so a pool that re-resolves sees pods come and
go behind a headless Service. The lookup is a parameter: tests swap in their own table of names.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

# (host, port) -> the "host:port" addresses it names right now.
HostLookup = Callable[[str, int], Awaitable[list[str]]]

DNS_PREFIX = "dns:///"


@dataclass(frozen=True)
class Target:
    """One entry of `--env-servers`: a fixed address, or a DNS name re-resolved over time."""

    host: str
    port: int
    dynamic: bool

    def __str__(self) -> str:
        address = format_address(self.host, self.port)
        return DNS_PREFIX + address if self.dynamic else address


def format_address(host: str, port: int) -> str:
    """`host:port`, with IPv6 literals bracketed as gRPC expects."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split_host_port(text: str, original: str) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"bad env-server target {original!r}: expected [ipv6]:port")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or ":" in host:
            raise ValueError(f"bad env-server target {original!r}: expected host:port (bracket IPv6 literals)")
    if not host:
        raise ValueError(f"bad env-server target {original!r}: empty host")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad env-server target {original!r}: port must be 1-65535")
    return host, int(port_text)


def parse_target(text: str) -> Target:
    """`host:port` (fixed) or `dns:///name:port` (re-resolved). The port is always explicit: env servers
    are not on gRPC's default 443, and a silent default would dial the wrong port."""
    text = text.strip()
    if text.startswith(DNS_PREFIX):
        return Target(*_split_host_port(text[len(DNS_PREFIX):], text), dynamic=True)
    if text.startswith("dns:"):
        raise ValueError(f"bad env-server target {text!r}: use dns:///name:port (a DNS authority is not supported)")
    if "://" in text:
        raise ValueError(f"bad env-server target {text!r}: only host:port and dns:///name:port are supported")
    return Target(*_split_host_port(text, text), dynamic=False)


def parse_targets(spec: str | Iterable[str]) -> tuple[Target, ...]:
    """A comma-separated string (the CLI form) or a list of entries; duplicates are kept once."""
    entries = spec.split(",") if isinstance(spec, str) else list(spec)
    targets = tuple(dict.fromkeys(parse_target(e) for e in entries if e.strip()))
    if not targets:
        raise ValueError("no env-server targets given")
    return targets


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives for `host` (every A/AAAA record), in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(format_address(info[4][0], port) for info in infos))


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve(targets: Iterable[Target], lookup: HostLookup = system_lookup) -> list[str]:
    """Every address the targets name now, each once, in target order. A DNS name that fails to resolve
    contributes nothing (its pods may be between restarts); fixed targets are passed through for gRPC to
    dial, which resolves their host name itself."""
    addresses: dict[str, None] = {}
    for target in targets:
        if not target.dynamic or _is_ip_literal(target.host):
            addresses[format_address(target.host, target.port)] = None
            continue
        try:
            found = await lookup(target.host, target.port)
        except OSError:
            found = []
        addresses.update(dict.fromkeys(found))
    return list(addresses)
