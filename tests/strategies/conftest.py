"""Fixtures of the strategy tests: the tiny GPT's single-device reference
(:mod:`gpt_reference`)."""
import pytest

from gpt_reference import HYPER, TINY, TOLERANCE, Reference  # noqa: F401


@pytest.fixture(scope="session")
def reference():
    return Reference()


@pytest.fixture(scope="session")
def make_reference():
    return Reference
