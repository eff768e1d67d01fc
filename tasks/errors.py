"""Errors shared by stage packages, defined below every one of them (the sandbox raises what the verifiers
catch), so that no package imports another only for an exception."""


class VerifierUnavailable(RuntimeError):
    """What a verifier needs is missing for every item, not this one (no sandbox isolation, a judge that does not
    answer): the stage fails with the reason instead of scoring every response 0."""
