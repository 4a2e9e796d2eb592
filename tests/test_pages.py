"""distsim.pages.small_pages: numpy's huge-page request is off inside the
block and as it was after, nested or not, and on error."""
import numpy as np
import pytest

from distsim import pages


def _current(setter) -> bool:
    was = setter(False)
    setter(was)
    return was


@pytest.fixture
def setter():
    found = pages._hugepage_setter()
    if found is None:
        pytest.skip("this numpy has no huge-page switch")
    was = found(True)
    yield found
    found(was)


def test_off_inside_and_restored_after(setter):
    assert _current(setter) is True
    with pages.small_pages():
        assert _current(setter) is False
        with pages.small_pages():
            assert _current(setter) is False
        assert _current(setter) is False
        np.ones(1 << 20).sum()          # arrays still work
    assert _current(setter) is True


def test_a_block_that_was_off_stays_off(setter):
    setter(False)
    with pages.small_pages():
        pass
    assert _current(setter) is False


def test_restored_when_the_block_raises(setter):
    with pytest.raises(KeyError):
        with pages.small_pages():
            raise KeyError("x")
    assert _current(setter) is True


def test_no_switch_is_a_no_op(monkeypatch):
    monkeypatch.setattr(pages, "_hugepage_setter", lambda: None)
    with pages.small_pages():
        assert np.arange(3).sum() == 3


def test_simulate_runs_with_small_pages(setter, monkeypatch):
    """distsim.simulate builds and simulates inside the block."""
    import distsim
    from distsim import api
    seen = []
    real = api._build_program

    def spy(*args, **kwargs):
        seen.append(_current(setter))
        return real(*args, **kwargs)
    monkeypatch.setattr(api, "_build_program", spy)
    distsim.simulate(model="tiny", topology="dgx-a100", dp=8)
    assert seen == [False]
    assert _current(setter) is True
