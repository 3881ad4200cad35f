"""Which tokens of a session train (data/chat.py `session_tokens`) under the chat templates of other
model families, on a real byte-level BPE: templates written here in the manner of Llama 3.x, Mistral
(v3 / tekken), Gemma 2/3, Phi-3, DeepSeek-R1 and Qwen2.5 (each with its quirk: a dated system header
and tools in the first user turn, the system prompt in the last user turn, alternation and the model
role, an EOS only without a generation prompt, a generation prompt that opens the reasoning, tool
results merged in one turn), and two with `{% generation %}` markers, whose masks must be HF's own.
Each expectation is the text of each trained run, decoded."""

import pytest

from ds_longctx.data.chat import ChatError, session_tokens
from ds_longctx.parallel.units import IGNORE_INDEX
from tests.corpus import bpe_tokenizer

LLAMA = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
MISTRAL = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
GEMMA = ["<bos>", "<start_of_turn>", "<end_of_turn>"]
PHI = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
CHATML = ["<|im_start|>", "<|im_end|>"]

H = "<|start_header_id|>{r}<|end_header_id|>\n\n"
LLAMA3 = (  # the system turn carries a date; tools go into the first user turn (which must exist)
    "{{ bos_token }}{% set msgs = messages %}{% set system = '' %}"
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set msgs = "
    "messages[1:] %}"
    "{% endif %}" + H.format(r="system") + "{% if tools %}Environment: ipython\n{% endif %}"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{{ system }}<|eot_id|>"
    "{% if tools %}{% if not msgs %}{{ raise_exception('no first user message to put the tools "
    "in') }}{% endif %}"
    + H.format(r="user")
    + "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{{ msgs[0].content }}<|eot_id|>"
    "{% set msgs = msgs[1:] %}{% endif %}"
    "{% for m in msgs %}{% if m.role == 'assistant' and m.tool_calls %}"
    + H.format(r="assistant")
    + '{"name": "{{ m.tool_calls[0].function.name }}", "parameters": '
    "{{ m.tool_calls[0].function.arguments | tojson }}}<|eot_id|>"
    "{% elif m.role == 'tool' %}" + H.format(r="ipython") + "{{ m.content }}<|eot_id|>"
    "{% else %}"
    + H.format(r="{{ m.role }}")
    + "{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + H.format(r="assistant") + "{% endif %}"
)
MISTRAL3 = (  # no generation prompt; the system prompt and the tools go with the last user turn
    "{{ bos_token }}{% set msgs = messages %}{% set system = '' %}"
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set msgs = "
    "messages[1:] %}{% endif %}{% set ns = namespace(last=-1) %}"
    "{% for m in msgs %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% "
    "endfor %}{% for m in msgs %}{% if m.role == 'user' %}"
    "{% if loop.index0 == ns.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson "
    "}}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{% if loop.index0 == ns.last and system %}{{ system }}\n\n{% endif %}{{ m.content "
    "}}[/INST]"
    "{% elif m.role == 'assistant' %}{% if m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "{% if not loop.last %}, {% endif %}{% endfor %}]{% else %}{{ m.content }}{% endif %}{{ "
    "eos_token }}"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}"
)
GEMMA3 = (  # the system prompt opens the first user turn; user and model alternate
    "{{ bos_token }}{% set msgs = messages %}{% set prefix = '' %}"
    "{% if messages[0].role == 'system' %}{% set prefix = messages[0].content + '\n\n' %}{% set "
    "msgs = messages[1:] %}"
    "{% endif %}{% for m in msgs %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ prefix if loop.first "
    "else '' }}{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt "
    "%}<start_of_turn>model\n{% endif %}"
)
PHI3 = (  # EOS closes the conversation only when no generation prompt follows
    "{% for m in messages %}{{ '<|' + m.role + '|>' }}\n{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
)
DEEPSEEK_R1 = (  # past turns lose their reasoning; the generation prompt opens a new one
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
    "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}{% set c = m.content %}"
    "{% if not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<｜Assistant｜>{{ c }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
# consecutive tool results share one user turn: its end moves when another result follows
QWEN25 = (
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\nGEN{{ m.content or '' }}{% for c in "
    "m.tool_calls or [] %}"
    '\n<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | '
    "tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\nEND{% else %}<|im_start|>{{ m.role }}\n{{ m.content "
    "}}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_GEN = (
    LLAMA3.replace(
        "{{ m.content | trim }}<|eot_id|>",
        "{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content | trim }}<|eot_id|>{% endgeneration %}{% else %}{{ m.content | trim }}"
        "<|eot_id|>{% endif %}",
    )
    .replace('{"name"', '{% generation %}{"name"')
    .replace(
        "arguments | tojson }}}<|eot_id|>", "arguments | tojson }}}<|eot_id|>{% endgeneration %}"
    )
)


def markers(template: str, on: bool) -> str:
    return template.replace("GEN", "{% generation %}" if on else "").replace(
        "END", "{% endgeneration %}" if on else ""
    )


TOKENIZERS = {
    "llama": (LLAMA, "<|eot_id|>", "<|begin_of_text|>"),
    "mistral": (MISTRAL, "</s>", "<s>"),
    "gemma": (GEMMA, "<end_of_turn>", "<bos>"),
    "phi": (PHI, "<|endoftext|>", None),
    "deepseek": (DEEPSEEK, "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"),
    "chatml": (CHATML, "<|im_end|>", None),
}
TEMPLATES = {
    "llama3": ("llama", LLAMA3),
    "llama3_gen": ("llama", LLAMA3_GEN),
    "mistral3": ("mistral", MISTRAL3),
    "gemma3": ("gemma", GEMMA3),
    "phi3": ("phi", PHI3),
    "deepseek_r1": ("deepseek", DEEPSEEK_R1),
    "qwen25": ("chatml", markers(QWEN25, False)),
    "qwen25_gen": ("chatml", markers(QWEN25, True)),
}


@pytest.fixture(scope="module")
def tokenizers():
    return {k: bpe_tokenizer(*v) for k, v in TOKENIZERS.items()}


def tok_for(tokenizers, name: str):
    family, template = TEMPLATES[name]
    tok = tokenizers[family]
    tok.chat_template = template
    return tok


def trained(tok, ids: list, labels: list) -> list:
    """The decoded text of each run of trained tokens."""
    runs, cur = [], []
    for i, lab in zip(ids, labels):
        if lab != IGNORE_INDEX:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    return [tok.decode(r) for r in runs + ([cur] if cur else [])]


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CHAT = [
    SYSTEM,
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "I am fine."},
    {"role": "user", "content": "how are you?"},
    {"role": "assistant", "content": "The weather is nice."},
]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
CALL = {
    "id": "call00001",
    "type": "function",
    "function": {"name": "search", "arguments": {"q": "pack"}},
}
AGENT = [
    SYSTEM,
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "ok"},
    {"role": "tool", "content": "fine"},
    {"role": "assistant", "content": "The weather is nice."},
]
TURNS = {
    "llama3": ["I am fine.<|eot_id|>", "The weather is nice.<|eot_id|>"],
    "mistral3": None,  # the system prompt moves to the last user turn: refused (see below)
    "gemma3": ["I am fine.<end_of_turn>\n", "The weather is nice.<end_of_turn>\n"],
    "phi3": ["I am fine.<|end|>\n", "The weather is nice.<|end|>\n"],  # not the closing EOS
    "deepseek_r1": ["I am fine.<｜end▁of▁sentence｜>", "The weather is nice.<｜end▁of▁sentence｜>"],
    "qwen25": ["I am fine.<|im_end|>\n", "The weather is nice.<|im_end|>\n"],
}


@pytest.mark.parametrize("name", [k for k, v in TURNS.items() if v])
def test_each_family_trains_its_assistant_turns_not_their_headers(tokenizers, name):
    tok = tok_for(tokenizers, name)
    ids, labels = session_tokens(tok, CHAT, None, "assistant")
    assert ids == tok.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    assert trained(tok, ids, labels) == TURNS[name]
    ids, labels = session_tokens(tok, CHAT, None, "last_assistant")
    assert trained(tok, ids, labels) == TURNS[name][-1:]


def test_tool_sessions_of_templates_whose_prefixes_do_not_render(tokenizers):
    """Llama's tools need a first user turn (a prefix of the system message alone fails to render);
    Qwen2.5's tool turn ends only after the last of consecutive results: neither matters to the
    assistant turns, which train."""
    tok = tok_for(tokenizers, "llama3")
    ids, labels = session_tokens(tok, AGENT[:4] + AGENT[5:], TOOLS, "assistant")
    assert trained(tok, ids, labels) == [
        '{"name": "search", "parameters": {"q": "pack"}}<|eot_id|>',
        "The weather is nice.<|eot_id|>",
    ]
    tok = tok_for(tokenizers, "qwen25")
    ids, labels = session_tokens(tok, AGENT, TOOLS, "assistant")
    assert trained(tok, ids, labels) == [
        '<tool_call>\n{"name": "search", "arguments": {"q": "pack"}}\n</tool_call><|im_end|>\n',
        "The weather is nice.<|im_end|>\n",
    ]


def test_templates_that_rewrite_earlier_turns_are_refused_and_last_assistant_still_trains(
    tokenizers,
):
    """DeepSeek-R1 drops the reasoning of past turns and Mistral moves the system prompt to the last
    user turn: every assistant turn cannot be told apart, the last one can (its generation prompt's
    `<think>` is the prompt's)."""
    think = [
        {**m, "content": "<think>\nhmm\n</think>\n\n" + m["content"]}
        if m["role"] == "assistant"
        else m
        for m in CHAT
    ]
    for name, chat in (("deepseek_r1", think), ("mistral3", CHAT)):
        tok = tok_for(tokenizers, name)
        with pytest.raises(
            ChatError,
            match="rewrites earlier turns .message 2, assistant.*data.train_on: last_assistant",
        ):
            session_tokens(tok, chat, None, "assistant")
        ids, labels = session_tokens(tok, chat, None, "last_assistant")
        want = (
            "hmm\n</think>\n\nThe weather is nice.<｜end▁of▁sentence｜>"
            if name == "deepseek_r1"
            else "The weather is nice.</s>"
        )
        assert trained(tok, ids, labels) == [want]


def test_a_tokenizer_without_offsets_is_refused_for_masks_and_trains_all(tokenizers, monkeypatch):
    tok = tok_for(tokenizers, "llama3")
    monkeypatch.setattr(type(tok), "is_fast", property(lambda self: False))
    with pytest.raises(ChatError, match="is not a fast one: it gives no character offsets"):
        session_tokens(tok, CHAT, None, "assistant")
    ids, labels = session_tokens(tok, CHAT, None, "all")
    assert ids == labels


def test_gemma_refuses_a_tool_turn_by_its_own_message(tokenizers):
    with pytest.raises(
        ChatError,
        match="failed to render this session .TemplateError: Conversation roles must alternate",
    ):
        session_tokens(tok_for(tokenizers, "gemma3"), AGENT, TOOLS, "assistant")


@pytest.mark.parametrize("name", ["llama3_gen", "qwen25_gen"])
@pytest.mark.parametrize("session", ["chat", "agent"])
def test_generation_markers_give_hf_assistant_mask_and_agree_with_the_prefix_rule(
    tokenizers, name, session
):
    """With markers: exactly HF's `return_assistant_tokens_mask`; the same template without them
    (each message what it adds to the rendering) trains the same tokens."""
    messages, tools = (CHAT, None) if session == "chat" else (AGENT[:4] + AGENT[5:], TOOLS)
    tok = tok_for(tokenizers, name)
    ids, labels = session_tokens(tok, messages, tools, "assistant")
    hf = tok.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert (
        ids == hf["input_ids"] and [int(v != IGNORE_INDEX) for v in labels] == hf["assistant_masks"]
    )
    assert sum(hf["assistant_masks"]) > 0
    tok.chat_template = tok.chat_template.replace("{% generation %}", "").replace(
        "{% endgeneration %}", ""
    )
    assert session_tokens(tok, messages, tools, "assistant") == (ids, labels)


def test_generation_blocks_are_counted_only_where_some_assistant_message_does_not_train(tokenizers):
    """An empty generation block marks no token: HF's mask trains as it is; telling the last answer
    from the others needs one run per assistant message, and says so."""
    tok = tokenizers["chatml"]
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}"
    )
    chat = CHAT[1:3] + [{"role": "user", "content": "ok"}, {"role": "assistant", "content": ""}]
    ids, labels = session_tokens(tok, chat, None, "assistant")
    assert trained(tok, ids, labels) == ["I am fine."]
    with pytest.raises(ChatError, match="mark 1 spans but the session has 2 assistant messages"):
        session_tokens(tok, chat, None, "last_assistant")


# writes a call's arguments as the JSON text it is given (the templates of DeepSeek-V3 and R1)
DEEPSEEK_CALLS = (
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<｜Assistant｜>"
    "{% for c in m.tool_calls %}{{ c.function.name + '\n```json\n' + c.function.arguments + "
    "'\n```' }}{% endfor %}"
    "<｜end▁of▁sentence｜>{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content "
    "}}<｜end▁of▁sentence｜>{% else %}<｜User｜>{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)


def test_text_parts_and_json_text_arguments_render_as_the_template_expects(tokenizers):
    """Content as a list of text parts is its text (Llama's `| trim` would write the list's repr);
    arguments given as JSON text are the object (tojson would quote the text), unless the template
    writes them as text (DeepSeek's)."""
    tok = tok_for(tokenizers, "llama3")
    parts = [
        {
            **m,
            "content": [
                {"type": "text", "text": m["content"][:5]},
                {"type": "text", "text": m["content"][5:]},
            ],
        }
        for m in CHAT
    ]
    assert session_tokens(tok, parts, None, "assistant") == session_tokens(
        tok, CHAT, None, "assistant"
    )
    text_call = {**CALL, "function": {**CALL["function"], "arguments": '{"q": "pack"}'}}
    chat = [
        CHAT[1],
        {"role": "assistant", "content": "", "tool_calls": [text_call]},
        {"role": "tool", "content": "ok"},
        CHAT[4],
    ]
    objects = [*chat[:1], {**chat[1], "tool_calls": [CALL]}, *chat[2:]]
    ids, labels = session_tokens(tok, chat, TOOLS, "assistant")
    assert (ids, labels) == session_tokens(tok, objects, TOOLS, "assistant")
    assert '"parameters": {"q": "pack"}' in trained(tok, ids, labels)[0]
    tok = tokenizers["deepseek"]
    tok.chat_template = DEEPSEEK_CALLS
    assert (
        trained(tok, *session_tokens(tok, chat, None, "assistant"))[0]
        == 'search\n```json\n{"q": "pack"}\n```<｜end▁of▁sentence｜>'
    )
    with pytest.raises(ChatError, match="failed to render this session .TypeError"):
        session_tokens(
            tok, objects, None, "assistant"
        )  # objects it cannot write: the template's own error


def test_with_markers_a_trained_user_turn_adds_to_hf_mask_not_replaces_it(tokenizers):
    """A user message flagged to train is placed by the prefix rule; the assistant turns keep HF's
    mask, here one that begins at the header's newline (TRL's training templates mark it)."""
    tok = tokenizers["chatml"]
    tok.chat_template = markers(QWEN25, True).replace(
        "assistant\n{% generation %}", "assistant{% generation %}{{ '\\n' }}"
    )
    chat = [CHAT[1], {**CHAT[2], "train": False}, {**CHAT[3], "train": True}, CHAT[4]]
    ids, labels = session_tokens(tok, chat, None, "assistant")
    hf = tok.apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids == hf["input_ids"]
    assert trained(tok, ids, labels) == [
        "<|im_start|>user\nhow are you?<|im_end|>\n",
        "\nThe weather is nice.<|im_end|>\n",
    ]
    last = (
        max(j for j, v in enumerate(hf["assistant_masks"]) if not v) + 1
    )  # the last assistant turn's HF run
    assert (
        all(v != IGNORE_INDEX for v in labels[last:])
        and trained(tok, ids[last:], labels[last:])[0][0] == "\n"
    )


@pytest.mark.parametrize("name", list(TURNS))
def test_the_prefix_rules_direct_renders_give_apply_chat_templates_tokens(
    tokenizers, name, monkeypatch
):
    """The prefix rule renders through the compiled template (chat._direct) only where that gives
    apply_chat_template's renderings: with it and without it, the same ids and labels (or the same
    refusal), chat and tool sessions."""
    import ds_longctx.data.chat as chat

    tok, real, made = tok_for(tokenizers, name), chat._direct, []

    def outcome(msgs, tools):
        try:
            return session_tokens(tok, msgs, tools, "assistant")
        except ChatError as e:
            return str(e)

    for msgs, tools in ((CHAT, None), (AGENT, TOOLS)):
        monkeypatch.setattr(chat, "_direct", lambda *a: made.append(real(*a)) or made[-1])
        direct = outcome(msgs, tools)
        monkeypatch.setattr(chat, "_direct", lambda *a: None)
        assert outcome(msgs, tools) == direct
    assert made and all(m is not None for m in made), (
        name
    )  # it ran, and matched the whole session's renderings
