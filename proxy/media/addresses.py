"""Which addresses a media fetch may connect to (spec v2.5 §11.1 "block private IPs"; OWASP API7).

An explicit table, not ``ipaddress.is_global`` (Python 3.11 calls parts of 192.0.0.0/24 and all of
192.88.99.0/24 global). It is built from the IANA IPv4 Special-Purpose Address Registry and the
IANA IPv6 Special-Purpose Address Registry (last updated 2025-10-09), plus the multicast blocks
and, for IPv6, everything outside the global unicast space ``2000::/3`` (IANA IPv6 Address Space
registry). **Every special-purpose block is refused, including those IANA marks globally
reachable** (AS112 192.31.196.0/24 and 2001:4:112::/48, AMT 192.52.193.0/24 and 2001:3::/32, the
PCP/TURN/DNS-SD anycast addresses 2001:1::1-3, ORCHIDv2, drone remote ID): none is where media is
served from, and a fetch has nothing to gain from them. The most specific entry names the reason.

An IPv6 address that embeds an IPv4 one (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4
``2002::/16``) is refused anyway (each is a special-purpose block) and the reason names the
embedded address when that one is refused too, so ``[::ffff:127.0.0.1]`` reads as loopback. IP
literals in the legacy notations (``127.1``, ``0x7f.1``, ``2130706433``) are never parsed here:
the fetcher asks ``getaddrinfo`` — the same call the connection would make — and judges every
address it answers.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Special:
    """One row of an IANA special-purpose registry (or of the address space it adds)."""

    block: IPNetwork
    name: str
    globally_reachable: bool = False
    """IANA's "Globally Reachable" column; refused all the same (see the module docstring)."""


def _rows(*rows: tuple[str, str] | tuple[str, str, bool]) -> tuple[Special, ...]:
    return tuple(Special(ipaddress.ip_network(r[0]), r[1], *r[2:]) for r in rows)


SPECIAL_V4 = _rows(
    ("0.0.0.0/8", "This network"),
    ("0.0.0.0/32", "This host on this network"),
    ("10.0.0.0/8", "Private-Use"),
    ("100.64.0.0/10", "Shared Address Space"),
    ("127.0.0.0/8", "Loopback"),
    ("169.254.0.0/16", "Link Local"),
    ("172.16.0.0/12", "Private-Use"),
    ("192.0.0.0/24", "IETF Protocol Assignments"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix"),
    ("192.0.0.8/32", "IPv4 dummy address"),
    ("192.0.0.9/32", "Port Control Protocol Anycast", True),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", True),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112-v4", True),
    ("192.52.193.0/24", "AMT", True),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)"),
    ("192.168.0.0/16", "Private-Use"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", True),
    ("198.18.0.0/15", "Benchmarking"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)"),
    ("240.0.0.0/4", "Reserved"),
    ("255.255.255.255/32", "Limited Broadcast"),
    ("224.0.0.0/4", "Multicast (IANA IPv4 Multicast Address Space)"),
)
SPECIAL_V6 = _rows(
    ("::1/128", "Loopback Address"),
    ("::/128", "Unspecified Address"),
    ("::ffff:0:0/96", "IPv4-mapped Address"),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", True),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat."),
    ("100::/64", "Discard-Only Address Block"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix"),
    ("2001::/23", "IETF Protocol Assignments"),
    ("2001::/32", "TEREDO"),
    ("2001:1::1/128", "Port Control Protocol Anycast", True),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", True),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", True),
    ("2001:2::/48", "Benchmarking"),
    ("2001:3::/32", "AMT", True),
    ("2001:4:112::/48", "AS112-v6", True),
    ("2001:10::/28", "Deprecated (previously ORCHID)"),
    ("2001:20::/28", "ORCHIDv2", True),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", True),
    ("2001:db8::/32", "Documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", True),
    ("3fff::/20", "Documentation"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs"),
    ("fc00::/7", "Unique-Local"),
    ("fe80::/10", "Link-Local Unicast"),
    ("fec0::/10", "Site-Local Unicast (deprecated; IANA IPv6 Address Space)"),
    ("ff00::/8", "Multicast (IANA IPv6 Address Space)"),
)
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
"""IPv6 outside it is not allocated as global unicast (IANA IPv6 Address Space): refused."""

METADATA = {
    ipaddress.ip_address("169.254.169.254"): "cloud metadata (AWS, GCP, Azure, OpenStack)",
    ipaddress.ip_address("169.254.170.2"): "cloud metadata (ECS task credentials)",
    ipaddress.ip_address("100.100.100.200"): "cloud metadata (Alibaba)",
    ipaddress.ip_address("fd00:ec2::254"): "cloud metadata (AWS IPv6)",
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def special(ip: IPAddress) -> Special | None:
    """The most specific special-purpose row ``ip`` falls in, or None."""
    rows = SPECIAL_V4 if isinstance(ip, ipaddress.IPv4Address) else SPECIAL_V6
    found = [row for row in rows if ip in row.block]
    return max(found, key=lambda row: row.block.prefixlen) if found else None


def refusal(ip: IPAddress) -> str | None:
    """Why a fetch may not connect to ``ip``, or None when it is an ordinary global address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            reason = refusal(inner)
            if reason is not None:
                return f"{reason} (embedded in {ip})"
    if ip in METADATA:
        return METADATA[ip]
    row = special(ip)
    if row is not None:
        return f"special-purpose address: {row.name} ({row.block})"
    if isinstance(ip, ipaddress.IPv6Address) and ip not in GLOBAL_UNICAST_V6:
        return f"address outside the IPv6 global unicast space {GLOBAL_UNICAST_V6}"
    return None


def parse(address: str) -> IPAddress:
    """An address as ``getaddrinfo`` answers it (an IPv6 scope id dropped)."""
    return ipaddress.ip_address(address.split("%", 1)[0])
