"""The bcrypt hash used for exporter basic auth (filter gpufleet_bcrypt); the Slurm
exporter's shard filters (gpufleet_node_shards, gpufleet_slurm_params)."""

from __future__ import annotations

import bcrypt
import pytest

from gpufleet.scrape_targets import node_shards, slurm_params
from gpufleet.web import bcrypt_hash, bcrypt_salt


def test_hash_verifies_and_is_stable_per_seed() -> None:
    first = bcrypt_hash("correct horse", "node1/prometheus")
    assert bcrypt.checkpw(b"correct horse", first.encode())
    assert first == bcrypt_hash("correct horse", "node1/prometheus")


def test_salt_differs_between_hosts_and_users() -> None:
    salts = {bcrypt_salt(seed) for seed in ("a/prometheus", "b/prometheus", "a/other")}
    assert len(salts) == 3


def test_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="empty password"):
        bcrypt_hash("", "seed")


GROUPS = {
    "all": ["a", "b", "c", "mon"],
    "prometheus": ["mon"],
    "prometheus_shard_0": ["b", "a"],
    "prometheus_shard_1": ["c"],
    "prometheus_shard_10": [],
    "prometheus_shard_x": ["mon"],  # not a shard group
    "prometheus_global": ["mon"],
}


def test_the_node_map_is_the_shard_groups() -> None:
    assert node_shards(GROUPS) == {"shards": {"0": ["a", "b"], "1": ["c"], "10": []}}
    assert node_shards({"all": ["a"]}) == {"shards": {}}


@pytest.mark.parametrize(
    ("instance", "params"),
    [
        ({"mode": "shard", "shard": 0}, {"shard": ["0"], "cluster": ["1"]}),
        ({"mode": "shard", "shard": 1}, {"shard": ["1"]}),
        ({"mode": "shard", "shard": 10}, {"shard": ["10"]}),
        ({"mode": "standalone", "shard": None}, {}),
        ({"mode": "global", "shard": None}, {}),
    ],
)
def test_exactly_the_lowest_shard_asks_for_the_cluster_part(instance, params) -> None:
    assert slurm_params(instance, GROUPS) == params


def test_a_shard_without_shard_groups_still_gets_the_cluster_part() -> None:
    assert slurm_params({"mode": "shard", "shard": 3}, {"all": []}) == {
        "shard": ["3"],
        "cluster": ["1"],
    }
