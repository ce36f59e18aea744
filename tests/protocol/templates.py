# ruff: noqa: E501 - templates are copied as the models ship them
"""Qwen-style chat templates written out as Jinja, for tests (no downloads).

Both follow their models' published templates in the parts that matter here:
tools listed in the system turn, tool results wrapped in ``<tool_response>``
inside a user turn, consecutive tool results merged into one user turn.
"""

QWEN25_HERMES = """\
{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are Qwen.{% endif %}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{%- if not (loop.first and message.role == 'system') %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}
<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

QWEN3_CODER_XML = """\
{%- if messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}
{%- if tools %}

# Tools

You have access to the following functions:

<tools>
{%- for tool in tools %}
<function>
<name>{{ tool.function.name }}</name>
<description>{{ tool.function.description }}</description>
</function>
{%- endfor %}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
</function>
</tool_call>
{%- endif %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}<|im_end|>
{% elif message.role == 'tool' %}
{%- if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user
{%- endif %}
<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# A template that drops earlier assistant turns once a tool result follows: the
# continuation must refuse it rather than train on re-rendered history.
REWRITES_HISTORY = """\
{%- for message in messages %}
{%- if message.role == 'assistant' and not loop.last and messages[loop.index0 + 1].role == 'tool' %}<|im_start|>assistant
[hidden]<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Like templates that drop the reasoning of older turns: an assistant turn holding
# "</think>" that is followed by more than one message is shown without its reasoning.
# The history then renders differently once a tool message follows, but only for a
# model that wrote "</think>": model text decides whether the continuation holds.
DROPS_OLD_REASONING = """\
{%- for message in messages %}
{%- if message.role == 'assistant' and '</think>' in message.content and loop.index0 < messages|length - 2 %}<|im_start|>assistant
{{ message.content.split('</think>')[-1] }}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
