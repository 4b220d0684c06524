"""Two-way voice for the ambassador (AgentX Agent Teams, 'Two-way voice'), off unless a
provider is configured (``BATON_VOICE_BASE_URL``).

An OpenAI-compatible endpoint speaks a briefing (``POST /audio/speech``) and takes a
spoken question (``POST /audio/transcriptions``); a transcript goes through the same
inquiry core as a typed question, so voice gets the same tools and thread. Calls go
through the OpenAI SDK with its retries off, from the API process: they only turn
audio into text and back, and the inquiry itself still runs durably.
"""

from __future__ import annotations

import openai

from baton.errors import BatonError
from baton.settings import Settings

#: Largest spoken question accepted (bytes): about ten minutes of compressed speech.
MAX_AUDIO_BYTES = 5 * 1024 * 1024
#: Longest text sent to speech synthesis (the provider's own limit is 4096 characters).
MAX_SPEECH_CHARS = 4096


class VoiceOff(BatonError):
    """No voice provider is configured on this deployment."""

    code = "voice_off"
    status = 404
    title = "Voice is off"


class VoiceProviderError(BatonError):
    """The voice provider refused or failed the request."""

    code = "voice_provider_error"
    status = 502
    title = "Voice provider error"


class AudioTooLarge(BatonError):
    code = "audio_too_large"
    status = 413
    title = "Audio too large"


def _client(settings: Settings) -> openai.AsyncOpenAI:
    if not settings.voice_base_url:
        raise VoiceOff("voice is off: set BATON_VOICE_BASE_URL to an OpenAI-compatible endpoint")
    key = settings.voice_api_key.get_secret_value() if settings.voice_api_key else "unset"
    return openai.AsyncOpenAI(
        base_url=settings.voice_base_url, api_key=key, max_retries=0, timeout=60.0
    )


def enabled(settings: Settings) -> bool:
    """Whether a voice provider is configured."""
    return bool(settings.voice_base_url)


async def speak(settings: Settings, text: str) -> bytes:
    """MP3 audio of ``text`` (cut at :data:`MAX_SPEECH_CHARS`). Raises VoiceOff,
    VoiceProviderError."""
    client = _client(settings)
    try:
        audio = await client.audio.speech.create(
            model=settings.voice_tts_model,
            voice=settings.voice_name,
            input=text[:MAX_SPEECH_CHARS],
            response_format="mp3",
        )
        return await audio.aread()
    except openai.OpenAIError as exc:
        raise VoiceProviderError(f"speech synthesis failed: {exc}") from exc
    finally:
        await client.close()


async def transcribe(settings: Settings, *, filename: str, data: bytes, content_type: str) -> str:
    """The text of a spoken question. Raises VoiceOff, AudioTooLarge, VoiceProviderError."""
    client = _client(settings)
    if len(data) > MAX_AUDIO_BYTES:
        await client.close()
        raise AudioTooLarge(f"audio is limited to {MAX_AUDIO_BYTES} bytes", path="audio")
    try:
        result = await client.audio.transcriptions.create(
            model=settings.voice_stt_model, file=(filename, data, content_type)
        )
    except openai.OpenAIError as exc:
        raise VoiceProviderError(f"transcription failed: {exc}") from exc
    finally:
        await client.close()
    return result.text
