"""The public face: ``aioqueue.__all__`` is sorted, complete and importable."""

from __future__ import annotations

import inspect

import aioqueue


def test_all_is_sorted_and_importable() -> None:
    assert aioqueue.__all__ == sorted(aioqueue.__all__)
    for name in aioqueue.__all__:
        assert hasattr(aioqueue, name), name


def test_every_public_class_and_function_is_exported() -> None:
    public = {
        name
        for name, value in vars(aioqueue).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert public <= set(aioqueue.__all__)
