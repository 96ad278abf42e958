"""What the tests of vitkit's messages check: that a message names the problem and the fix."""


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
