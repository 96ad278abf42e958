"""The saved models the in-process `vitkit serve` tests share, one of each per test module."""

from __future__ import annotations

import pytest

from serve_models import save_classifier, save_regressor


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("serve") / "classifier")


@pytest.fixture(scope="module")
def regressor(tmp_path_factory):
    return save_regressor(tmp_path_factory.mktemp("serve") / "regressor")
