"""Failures of a query as classes and codes, and which of them a restart can help.

``codes`` names each of twophase's errors (``[TWOPHASE_UNREACHABLE] ...`` in its message),
``causes`` reads a failed query's error into its chain of causes, ``classify`` says whether
a restart can help. All plain Python: the Spark binding hands them the query's error.
"""

from twophase.failures.causes import Cause, Failure, failureOfPython, failureOfText
from twophase.failures.classify import Classifier, Rule, Verdict
from twophase.failures.codes import CODES, ErrorCode, codesIn, declaredCode, marked

__all__ = [
    "CODES",
    "Cause",
    "Classifier",
    "ErrorCode",
    "Failure",
    "Rule",
    "Verdict",
    "codesIn",
    "declaredCode",
    "failureOfPython",
    "failureOfText",
    "marked",
]
