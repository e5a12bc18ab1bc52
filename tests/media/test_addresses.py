"""The media fetch's address vet is a table of the IANA special-purpose registries (issue #26
finding 5): one case per registered block — its first, a middle and its last address are
refused, the reason naming the block — and the neighbours just outside pass. Nothing connects
anywhere: the decision is a pure function of the address."""

from __future__ import annotations

import ipaddress

import pytest

from proxy.media.addresses import SPECIAL_V4, SPECIAL_V6, Special, _rows, parse, refusal

# Written out here, apart from the table, so a row dropped from the table fails a case.
IPV4_BLOCKS = [
    "0.0.0.0/8", "0.0.0.0/32", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32", "192.0.0.9/32", "192.0.0.10/32",
    "192.0.0.170/32", "192.0.0.171/32", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
    "192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "224.0.0.0/4",
]  # fmt: skip
IPV6_BLOCKS = [
    "::1/128", "::/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64",
    "100:0:0:1::/64", "2001::/23", "2001::/32", "2001:1::1/128", "2001:1::2/128", "2001:1::3/128",
    "2001:2::/48", "2001:3::/32", "2001:4:112::/48", "2001:10::/28", "2001:20::/28", "2001:30::/28",
    "2001:db8::/32", "2002::/16", "2620:4f:8000::/48", "3fff::/20", "5f00::/16", "fc00::/7",
    "fe80::/10", "fec0::/10", "ff00::/8",
]  # fmt: skip


@pytest.mark.parametrize("block", IPV4_BLOCKS + IPV6_BLOCKS)
def test_every_address_of_a_special_purpose_block_is_refused(block: str) -> None:
    network = ipaddress.ip_network(block)
    for address in (network[0], network[network.num_addresses // 2], network[-1]):
        reason = refusal(address)
        assert reason is not None, address
    assert any(row.block == network for row in (*SPECIAL_V4, *SPECIAL_V6)), block


@pytest.mark.parametrize(
    "address",
    [
        # What ipaddress.is_global (Python 3.11) calls global inside 192.0.0.0/24 and 192.88.99.0/24.
        "192.0.0.8", "192.0.0.12", "192.0.0.16", "192.0.0.100", "192.0.0.169", "192.0.0.172",
        "192.0.0.175", "192.0.0.176", "192.0.0.255", "192.88.99.1", "192.88.99.2", "192.88.99.255",
        # Globally reachable per IANA, refused all the same: nothing a media URL should reach.
        "192.31.196.1", "192.52.193.1", "192.175.48.1", "2001:1::1", "2001:4:112::1", "2620:4f:8000::1",
        "2001:3::1", "2001:20::1", "2001:30::1", "64:ff9b::808:808",
        # IPv6 outside 2000::/3.
        "4000::1", "1::1", "e000::1",
    ],
)  # fmt: skip
def test_blocks_is_global_misses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    ("address", "named"),
    [
        ("192.0.0.9", "Port Control Protocol Anycast"),  # the most specific row names the reason
        ("192.0.0.100", "IETF Protocol Assignments"),
        ("::ffff:127.0.0.1", "Loopback (127.0.0.0/8) (embedded in ::ffff:7f00:1)"),
        ("64:ff9b::a9fe:a9fe", "cloud metadata"),  # NAT64 of 169.254.169.254
        ("2002:c0a8:1::1", "Private-Use (192.168.0.0/16) (embedded"),  # 6to4 of 192.168.0.1
        ("::ffff:8.8.8.8", "IPv4-mapped Address"),  # a public IPv4 inside: the block still refuses
        ("169.254.169.254", "cloud metadata (AWS, GCP, Azure, OpenStack)"),
    ],
)
def test_the_reason_names_the_most_specific_block_or_the_embedded_address(address: str, named: str) -> None:
    reason = refusal(ipaddress.ip_address(address))
    assert reason is not None and named in reason, reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "2a00:1450:4001::1",
        # the neighbours just outside a block
        "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
        "192.0.1.0", "192.0.3.0", "192.88.98.255", "192.88.100.0", "198.17.255.255", "198.20.0.0",
        "223.255.255.255", "2001:200::1", "2003::1", "2001:db9::1", "3fff:1000::1", "2620:4f:8001::1",
    ],
)  # fmt: skip
def test_ordinary_global_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_a_table_row_keeps_its_block_name_and_reachability() -> None:
    assert _rows(("10.0.0.0/8", "Private-Use"), ("192.0.0.9/32", "PCP Anycast", True)) == (
        Special(ipaddress.ip_network("10.0.0.0/8"), "Private-Use", False),
        Special(ipaddress.ip_network("192.0.0.9/32"), "PCP Anycast", True),
    )


@pytest.mark.parametrize(
    ("answered", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("fe80::1%eth0", "fe80::1"),  # getaddrinfo's link-local answer carries the scope id
        ("fe80::1%eth0%x", "fe80::1"),  # everything after the first % is the scope
    ],
)
def test_parse_drops_the_scope_id_getaddrinfo_appends(answered: str, address: str) -> None:
    assert parse(answered) == ipaddress.ip_address(address)
    assert refusal(parse(answered)) is not None
