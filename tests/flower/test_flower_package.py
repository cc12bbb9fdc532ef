"""The Flower layer's package: its public names, imported on first use."""

from __future__ import annotations

import importlib

import pytest

import fl_gradcode.flower as package

MODULE_OF = {
    "VirtualClock": "clock", "WallClock": "clock", "EarlyReturnGrid": "grid",
    "gradient_coding_mod": "mod", "make_gradient_coding_mod": "mod", "partition_seed": "mod",
    "PROTOCOL_KEY": "protocol", "RejectedReply": "protocol", "GradientCoding": "wrapper",
    "CodePolicy": "policy", "FixedCodePolicy": "policy", "AdaptiveCodePolicy": "policy",
    "seeded_sampling": "sampling",
}


# ======== edges: exact values, bounds and messages ===============================================
@pytest.mark.parametrize("name", sorted(MODULE_OF))
def test_each_public_name_is_the_object_of_its_module_and_is_kept(name, monkeypatch):
    module = importlib.import_module(f"fl_gradcode.flower.{MODULE_OF[name]}")
    monkeypatch.delitem(vars(package), name, raising=False)  # as before its first use
    assert package.__getattr__(name) is getattr(module, name)
    assert vars(package)[name] is getattr(module, name)  # cached: no second lookup


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError) as info:
        package.__getattr__("GradientCodnig")
    assert str(info.value) == "module 'fl_gradcode.flower' has no attribute 'GradientCodnig'"
    with pytest.raises(AttributeError):
        _ = package.no_such_name


def test_dir_lists_every_public_name_sorted():
    names = package.__dir__()
    assert names == sorted(names)
    assert set(MODULE_OF) <= set(names) and set(package.__all__) == set(MODULE_OF)
    assert "__getattr__" in names
