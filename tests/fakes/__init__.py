"""Fakes shared by the unit and integration tests (`from tests.fakes.runtime import FakeRuntime`)."""
