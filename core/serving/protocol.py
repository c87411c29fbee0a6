"""The speech API's error side: an OpenAI-style error body (:class:`ApiError`) and the status a refused request
gets (:func:`refusal`). What a request's fields are is each pipeline's own: its declaration's speech adapter
(``PipelineSpec.speech``, :class:`core.pipeline.spec.SpeechApi`) parses the body with the shared field checks of
:mod:`core.pipeline.fields`, raising :class:`~core.pipeline.fields.FieldError` naming the field.

Light: importing it imports neither vLLM nor torch; the error body is built from vLLM's own ``ErrorResponse``
(``core.seams.OPENAI_ERROR_RESPONSE``) only when an error is sent.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from core.pipeline.fields import UnknownModelError
from core.seams import OPENAI_ERROR_RESPONSE


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body (vLLM's ``ErrorResponse``: ``{"error": {"message", "type",
    "param", "code"}}``). ``status``: the HTTP status (int); ``param``: the request field at fault, or None."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body, validated by vLLM's ``ErrorResponse`` model (``type`` is the status's name in vLLM's
        spelling, e.g. ``BadRequestError``, ``TooManyRequestsError``, ``ServiceUnavailableError``)."""
        phrase = HTTPStatus(self.status).phrase.replace(" ", "").replace("-", "")
        err_type = phrase if phrase.endswith("Error") else phrase + "Error"
        model = OPENAI_ERROR_RESPONSE.resolve()
        return model.model_validate({"error": {"message": self.message, "type": err_type, "param": self.param,
                                               "code": self.status}}).model_dump()


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 naming ``param``."""
    return ApiError(HTTPStatus.BAD_REQUEST, message, param)


def refusal(exc: Exception) -> ApiError:
    """The answer to a request the pipeline refused before any engine work (its speech adapter's ``parse`` or the
    stage graph's ``check``: a ``BadInputError``): 404 for :class:`~core.pipeline.fields.UnknownModelError`, as
    vLLM answers an unknown model, else 400; ``param``: the request field the error names (its ``param``)."""
    status = HTTPStatus.NOT_FOUND if isinstance(exc, UnknownModelError) else HTTPStatus.BAD_REQUEST
    return ApiError(status, str(exc), getattr(exc, "param", None))
