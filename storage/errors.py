"""Errors of the storage layer that the command line turns into one line."""


class LakeError(RuntimeError):
    """A lake operation failed for a reason the user can act on."""


class LeaseHeld(LakeError):
    """Another live process holds the lease (the message names it)."""


class LeaseLost(LakeError):
    """This process's lease was taken over: its writes are refused."""
