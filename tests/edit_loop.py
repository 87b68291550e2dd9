"""The edit loop's share of a parametrization that repeats one claim over many equivalent
cases (families, dtypes, thread counts): `make check` (-m "not slow") runs the cases named
in `keep`, chosen so that each code path the claim exercises still runs; `make test` runs
every case."""

import pytest


def check_subset(values, keep):
    """`values` as parametrize takes them (a tuple is one case of several arguments), the
    ones not in `keep` marked slow."""
    values, keep = list(values), list(keep)
    unknown = [k for k in keep if k not in values]
    assert not unknown, f"check_subset keeps {unknown}, which are not among the cases"

    def case(v, marks=()):
        return pytest.param(*v, marks=marks) if isinstance(v, tuple) else pytest.param(v, marks=marks)

    return [case(v) if v in keep else case(v, pytest.mark.slow) for v in values]
