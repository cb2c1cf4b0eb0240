"""The verl version this package is built against, and the guard that stops on any other.

Our agent loop, tool and config checks use verl 0.9.1 internals that change between releases
(verl's main branch removed `AgentLoopBase.apply_chat_template` and `data.continuous_token` in
verl PR #6804 and adds constructor arguments). The verl-facing entry points call
`check_verl_version()` first, so another verl fails at start-up with both versions named instead
of deep inside a rollout.
"""

from __future__ import annotations

from importlib import metadata

from verl_search.runtime import env

#: the verl release this package supports (setup.py's `[verl]` extra pins the same)
SUPPORTED_VERL_VERSION = "0.9.1"
#: set to 1 to run on another verl anyway (at your own risk: expect errors inside verl's agent loop)
SKIP_CHECK_ENV = env.SKIP_VERL_VERSION_CHECK


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is not `SUPPORTED_VERL_VERSION`."""


def installed_verl_version() -> str | None:
    """The installed verl distribution's version, or None when verl is not installed."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def check_verl_version(installed: str | None = None) -> None:
    """Stop unless verl `SUPPORTED_VERL_VERSION` is installed.

    Args:
        installed: the version to check (default: `installed_verl_version()`).

    Raises:
        UnsupportedVerlVersion: another version is installed (unless `$VERL_SEARCH_SKIP_VERL_VERSION_CHECK=1`);
            the message names both versions and the fix.
        verl_search.runtime.extras.MissingExtraError: verl is not installed at all.
    """
    from verl_search.runtime.extras import MissingExtraError, install_line

    installed = installed if installed is not None else installed_verl_version()
    if installed is None:
        raise MissingExtraError(f"verl is not installed; run: {install_line('verl')}")
    if installed == SUPPORTED_VERL_VERSION or env.read_env().skip_verl_version_check:
        return
    raise UnsupportedVerlVersion(
        f"verl {installed} is installed, but verl-search {_own_version()} supports verl {SUPPORTED_VERL_VERSION} only "
        f"(it uses agent-loop internals that change between verl releases). Run: pip install verl=={SUPPORTED_VERL_VERSION} "
        f"(or set {SKIP_CHECK_ENV}=1 to try anyway)"
    )


def _own_version() -> str:
    from verl_search import __version__

    return __version__
