"""Pictures in chat records (``trainer.data.pictures`` and the light scan): every shape users have — content parts
(``image``, ``image_url`` with a path or a data URL), TRL's ``{"type": "image"}`` parts with an ``images`` column,
ShareGPT/LLaVA ``<image>`` markers with ``image``/``images`` fields — normalised to content-part messages with
absolute paths; counted; a missing or unreadable picture is bad input naming the line and the file, or skipped and
counted with ``data.skip_bad_lines``. Light: no torch here."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from trainer.config.sections import RunConfig
from trainer.core.errors import UserError
from trainer.data import conversations, pictures
from trainer.data.scan import scan


def picture(path: Path, size=(8, 6), color=(200, 30, 30)) -> Path:
    """A small real PNG."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def data_cfg(path: Path, **extra):
    return RunConfig.model_validate({"data": {"path": str(path), **extra}}).data


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_content_parts_are_normalised_with_absolute_paths(tmp_path):
    cat = picture(tmp_path / "pics" / "cat.png")
    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "pics/cat.png"},
                                                     {"type": "text", "text": "What is this?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]}
    assert pictures.has_pictures(rec, "chat")
    assert pictures.normalise(rec, "chat", tmp_path) == [
        {"role": "user", "content": [{"type": "image", "image": str(cat)}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]
    url = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(cat)}}]},
                        {"role": "assistant", "content": "A cat."}]}
    assert pictures.pictures_of(pictures.normalise(url, "chat", tmp_path)) == [str(cat)]


def test_data_urls_become_one_cached_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    raw = picture(tmp_path / "dot.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    rec = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
                        {"role": "assistant", "content": "A dot."}]}
    (first,) = pictures.check(rec, "chat", tmp_path)
    assert Path(first).read_bytes() == raw and Path(first).parent == tmp_path / "cache" / "pictures"
    assert pictures.check(rec, "chat", tmp_path) == [first], "the same picture, the same file"


def test_sharegpt_llava_markers_and_the_images_field(tmp_path):
    a, b = picture(tmp_path / "a.png"), picture(tmp_path / "b.png")
    rec = {"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nDescribe it."},
                                               {"from": "gpt", "value": "Red."}]}
    assert pictures.normalise(rec, "sharegpt", tmp_path) == [
        {"role": "user", "content": [{"type": "image", "image": str(a)}, {"type": "text", "text": "Describe it."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Red."}]}]
    two = {"images": ["a.png", "b.png"], "messages": [{"role": "user", "content": "Compare <image> and <image>."},
                                                      {"role": "assistant", "content": "Same."}]}
    assert [p.get("image") or p["text"] for p in pictures.normalise(two, "chat", tmp_path)[0]["content"]] == \
        ["Compare ", str(a), " and ", str(b), "."]
    no_markers = {"images": ["a.png"], "conversations": [{"from": "human", "value": "Describe it."},
                                                         {"from": "gpt", "value": "Red."}]}
    assert pictures.normalise(no_markers, "sharegpt", tmp_path)[0]["content"][0] == {"type": "image", "image": str(a)}
    wrong = {"images": ["a.png", "b.png"], "messages": [{"role": "user", "content": "<image> only one"},
                                                        {"role": "assistant", "content": "x"}]}
    with pytest.raises(pictures.PictureProblem, match="2 picture"):
        pictures.normalise(wrong, "chat", tmp_path)


def test_trl_image_parts_take_the_pictures_of_the_images_column(tmp_path):
    a = picture(tmp_path / "a.png")
    rec = {"images": ["a.png"], "messages": [{"role": "user", "content": [{"type": "image"},
                                                                          {"type": "text", "text": "Colour?"}]},
                                             {"role": "assistant", "content": [{"type": "text", "text": "Red."}]}]}
    assert pictures.normalise(rec, "chat", tmp_path)[0]["content"] == [{"type": "image", "image": str(a)},
                                                                        {"type": "text", "text": "Colour?"}]


def test_text_only_records_and_literal_image_text_have_no_pictures():
    assert not pictures.has_pictures({"messages": [{"role": "user", "content": "<image> is a tag"}]}, "chat")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert not pictures.has_pictures(parts, "chat")
    assert not pictures.has_pictures({"text": "x", "image": "a.png"}, "text")


def test_web_addresses_are_refused_nothing_downloads(tmp_path):
    rec = {"images": ["https://example.com/cat.jpg"], "messages": [{"role": "user", "content": "What?"},
                                                                   {"role": "assistant", "content": "A cat."}]}
    with pytest.raises(pictures.PictureProblem, match="web address.*download it") as err:
        pictures.check(rec, "chat", tmp_path)
    assert err.value.field == "images[0]"


def test_scan_counts_pictures(tmp_path):
    picture(tmp_path / "a.png"), picture(tmp_path / "b.png")
    rows = [{"images": ["a.png", "b.png"], "messages": [{"role": "user", "content": "<image><image> Same?"},
                                                        {"role": "assistant", "content": "Yes."}]},
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]},
                          {"role": "assistant", "content": "Red."}]},
            {"messages": [{"role": "user", "content": "No picture."}, {"role": "assistant", "content": "Fine."}]}]
    path = write(tmp_path / "d.jsonl", rows)
    result = scan(str(path), data_cfg(path))
    assert result.record_format == "chat" and result.records == 3
    assert result.pictures == {"records_with_pictures": 2, "pictures": 3, "max_per_record": 2}
    assert result.picture_stamp
    text = write(tmp_path / "t.jsonl", [rows[2]])
    assert scan(str(text), data_cfg(text)).pictures["pictures"] == 0


def test_a_missing_picture_names_the_line_and_the_file(tmp_path):
    picture(tmp_path / "a.png")
    good = {"images": ["a.png"], "messages": [{"role": "user", "content": "What?"}, {"role": "assistant", "content": "A."}]}
    bad = {"images": ["gone.png"], "messages": [{"role": "user", "content": "What?"}, {"role": "assistant", "content": "B."}]}
    path = write(tmp_path / "d.jsonl", [good, good, bad, good])
    with pytest.raises(UserError) as err:
        scan(str(path), data_cfg(path))
    msg = str(err.value)
    assert "line 3" in msg and str(tmp_path / "gone.png") in msg and "data.skip_bad_lines" in msg
    skipped = scan(str(path), data_cfg(path, skip_bad_lines=True))
    assert skipped.records == 3 and skipped.skipped_lines == [3] and skipped.pictures["pictures"] == 3


def test_a_file_that_is_not_a_picture_is_refused(tmp_path):
    (tmp_path / "notes.png").write_text("not a picture")
    rec = {"image": "notes.png", "conversations": [{"from": "human", "value": "?"}, {"from": "gpt", "value": "!"}]}
    path = write(tmp_path / "d.jsonl", [rec])
    with pytest.raises(UserError, match=r"line 1, field 'image': .*notes.png is not a picture"):
        scan(str(path), data_cfg(path))


def test_skipped_picture_records_of_a_json_array_are_left_out_when_read(tmp_path):
    from trainer.data.readers import read_records

    picture(tmp_path / "a.png")
    rows = [{"images": [name], "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": name}]}
            for name in ("a.png", "gone.png", "a.png")]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    result = scan(str(path), data_cfg(path, skip_bad_lines=True))
    assert result.records == 2 and result.skipped_records == [1]
    kept = read_records(str(path), drop_records=result.skipped_records).rows
    assert [r["messages"][1]["content"] for r in kept] == ["a.png", "a.png"]


# -- the chat rules: content in the form the template renders --------------------------------------------------
PARTS_ONLY = ("{% for m in messages %}{{ m['role'] }}:{% for p in m['content'] %}{% if p['type'] == 'text' %}"
              "{{ p['text'] }}{% elif p['type'] == 'image' %}<image>{% endif %}{% endfor %}|{% endfor %}")
TEXT_ONLY = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"


def render_with(template: str):
    import jinja2

    tpl = jinja2.Environment().from_string(template)
    return lambda messages, gen: tpl.render(messages=messages, add_generation_prompt=gen)


def test_the_chat_rules_give_each_template_the_content_form_it_renders():
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    parts = conversations.Chat(render_with(PARTS_ONLY), lambda texts: [])
    assert parts.content_forms == (False, True)
    assert parts.shape([{"role": "user", "content": "Hi"}]) == text_parts, "a parts-only template gets parts"
    text = conversations.Chat(render_with(TEXT_ONLY), lambda texts: [])
    assert text.content_forms == (True, False), "a list printed as Python text is not rendered"
    assert text.shape(text_parts) == [{"role": "user", "content": "Hi"}]
    with_picture = [{"role": "user", "content": [{"type": "image", "image": "/a.png"}, {"type": "text", "text": "?"}]}]
    assert text.shape(with_picture) == with_picture, "a turn with a picture stays parts"


def test_a_merged_system_text_opens_a_turn_of_parts():
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image", "image": "/a.png"}, {"type": "text", "text": "?"}]}]
    merged = conversations.with_system_message(msgs, "merged")
    assert merged == [{"role": "user", "content": [{"type": "text", "text": "Be brief.\n\n"},
                                                   {"type": "image", "image": "/a.png"}, {"type": "text", "text": "?"}]}]


def test_preference_records_with_pictures_are_refused_not_trained_without_them(tmp_path):
    picture(tmp_path / "a.png")
    rec = {"images": ["a.png"], "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
           "chosen": [{"role": "assistant", "content": "A."}], "rejected": [{"role": "assistant", "content": "B."}]}
    path = write(tmp_path / "d.jsonl", [rec])
    with pytest.raises(UserError, match="line 1: a preference record with pictures"):
        scan(str(path), data_cfg(path))
