"""Programs warm start left out though nothing changed, until their identity was proved (issue
44): a module-level lambda, a namedtuple with a default, a branch on a view's storage offset,
a config deep-copied (its id a memo key), a parametrized layer (its class made at run time).
Cold then warm in two fresh processes, flag on, every result compared with eager in its own
process.  A file of its own, so that it runs beside tests/test_warm_campaign.py rather than
after it."""

from __future__ import annotations

from _children import requires_warm_start
from _warm_campaign import Case, Feature

from test_warm_campaign import _campaign, _starts_warm_unless_changed

pytestmark = requires_warm_start

REACHED = [
    Case(f"reach_{kind}{variant}{'m' if module else 'f'}_{changed}", module, train,
         (Feature(kind, 2.0, 3.0, "sin", "cos", variant),), "none", changed)
    for kind, variant, module, train, changed in (
        ("lambda_global", 0, False, True, None), ("lambda_global", 0, True, False, 0),
        ("namedtuple_default", 0, True, True, None), ("namedtuple_default", 1, False, False, 0),
        ("view_offset", 0, True, True, None), ("view_offset", 0, False, False, 0),
        ("config_copy", 0, False, True, None), ("config_copy", 1, True, False, None),
        ("config_copy", 0, True, False, 0), ("config_copy", 1, False, True, 0),
        ("parametrized", 0, True, True, None), ("parametrized", 1, False, False, None),
        ("parametrized", 0, False, True, 0), ("parametrized", 1, True, False, 0), ("parametrized", 2, True, True, 0),
        ("parametrized", 2, False, False, 0))
]


def test_lambdas_namedtuple_defaults_views_and_copied_configs_start_warm(tmp_path_factory):
    """A module-level lambda (its code, found by the global that holds it), a namedtuple with a
    default from another module (its ``__new__``'s namespace, described by what it holds and
    reached through the function), a branch on a view's storage offset after a graph break
    (the saved view keeps its offset), a config object deep-copied (``copy.deepcopy`` folds
    its id as a memo key: bound on the first call to an object of the same class and
    contents).  Unchanged, each starts warm; its body, default, field, offset or config value
    changed compiles again, and equals eager."""
    _starts_warm_unless_changed(REACHED, *_campaign(tmp_path_factory.mktemp("reach"), REACHED, flag=True))
