"""The Ray settings the launcher gives the node main_ppo starts (``stapo_verl.launch.train.ray_environment``): set
when unset, a user's value kept. That the installed Ray reads them, and what they prevent, is in
tests/integration/launch/test_ray_worker_register.py."""

from __future__ import annotations

from stapo_verl.launch import train


def test_an_unset_register_timeout_is_set_to_the_launchers():
    environ = {"OTHER": "x"}
    assert train.ray_environment(environ) == {"RAY_worker_register_timeout_seconds": "600"}
    assert environ == {"OTHER": "x", "RAY_worker_register_timeout_seconds": "600"}


def test_a_users_register_timeout_is_kept():
    environ = {"RAY_worker_register_timeout_seconds": "90"}
    assert train.ray_environment(environ) == {} and environ == {"RAY_worker_register_timeout_seconds": "90"}
    empty = {"RAY_worker_register_timeout_seconds": ""}  # set but empty: Ray would not parse it, so it is replaced
    assert train.ray_environment(empty) == {"RAY_worker_register_timeout_seconds": "600"} == empty
