from tests.fake_upstream import fake_upstream as fake_upstream
