"""Which addresses a media fetch may connect to (spec v2.5 §11.1 "block private IPs"; OWASP API7).

Only global unicast addresses pass. An IPv6 address that embeds an IPv4 one (``::ffff:a.b.c.d``,
NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged by the embedded address too, so
``[::ffff:127.0.0.1]`` is loopback. IP literals in the legacy notations (``127.1``, ``0x7f.1``,
``2130706433``, ``0177.0.0.1``) are never parsed here: the fetcher asks ``getaddrinfo`` — the
same call the connection would make — and judges every address it answers.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

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


def refusal(ip: IPAddress) -> str | None:
    """Why a fetch may not connect to ``ip``, or None when it is a global unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            reason = refusal(inner)
            if reason is not None:
                return f"{reason} (embedded in {ip})"
    if ip in METADATA:
        return METADATA[ip]
    for kind in ("loopback", "link_local", "multicast", "private", "reserved", "unspecified"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local"
    if not ip.is_global:
        return "not globally routable"
    return None


def parse(address: str) -> IPAddress:
    """An address as ``getaddrinfo`` answers it (an IPv6 scope id dropped)."""
    return ipaddress.ip_address(address.split("%", 1)[0])
