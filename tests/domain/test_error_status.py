"""`domain.errors`: an error class names its wire `code` alone and takes its status from the
one code → status table (`STATUS_BY_CODE`), so a class's code and status cannot disagree."""

from __future__ import annotations

import pytest

from domain import errors
from domain.errors import STATUS_BY_CODE, Conflict, HostError


def test_a_class_naming_only_its_code_takes_the_tables_status() -> None:
    class Gone(Conflict):
        code = "not_found"

    assert Gone.status == 404
    assert Gone("x").to_wire()["code"] == "not_found"


def test_every_error_class_status_is_its_codes() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, HostError)]
    assert len(classes) > 20
    for cls in classes:
        assert cls.status == STATUS_BY_CODE[cls.code], cls.__name__


def test_an_unknown_code_fails_when_the_class_is_made() -> None:
    with pytest.raises(KeyError):

        class Odd(HostError):  # noqa: F841 - made only to fail
            code = "no_such_code"
