"""Test helpers shipped with the code: fakes for the dependencies we do not run ourselves."""

from tests.support.fake_openai import FakeOpenAI, FakeOpenAIMode, RecordedRequest

__all__ = ["FakeOpenAI", "FakeOpenAIMode", "RecordedRequest"]
