import pytest

# programs the semantic tests lint (one is an entry script named like a test, `agent_test.py`): data, not tests
collect_ignore_glob = ["data/*"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-fixtures", action="store_true", help="rewrite fixtures/**/*.fixed.py goldens")


@pytest.fixture
def update_fixtures(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-fixtures"))
