"""The demo model's chat template: ChatML with thinking and qwen3_coder tool calls.

It follows the structure of the published Qwen3.5 template so that the engine, the reasoning parser
(``qwen3``) and the tool parser (``qwen3_coder``) see the same prompts and outputs they would with a
real checkpoint:

- tools are listed as JSON lines inside ``<tools>`` in the first system turn, followed by the call format;
  a system message given by the user comes after that block;
- an assistant turn after the last user query carries its reasoning as ``<think>\\n...\\n</think>\\n\\n``
  (``reasoning_content``, or ``reasoning``, or a ``</think>`` found inside ``content``); earlier turns drop it;
- ``tool_calls`` become ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...``.
  ``function.arguments`` must be a mapping (an OpenAI request carries a JSON string: parse it first, as
  vLLM does); string values are written raw, everything else as JSON;
- consecutive ``tool`` messages share one user turn, each wrapped in ``<tool_response>``;
- the generation prompt opens ``<think>\\n``, or closes an empty think block when ``enable_thinking`` is false.

Message content may be a string or a list of ``{"type": "text", "text": ...}`` parts; the demo model reads
no images. Every content is trimmed, as in the published template.
"""
from __future__ import annotations

# Written as one Python string (not package data) so that no packaging step can lose it.
CHAT_TEMPLATE = r"""{%- macro text_of(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for part in content %}
            {%- if part is mapping and part.type == 'text' %}
                {{- part.text }}
            {%- elif part is string %}
                {{- part }}
            {%- else %}
                {{- raise_exception('Only text content parts are supported by this model, got a part of type '
                                    ~ (part.type if part is mapping else 'unknown') ~ '; send text.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is defined and content is not none %}
        {{- raise_exception('Message content must be a string or a list of text parts.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages were given; send at least one user message.') }}
{%- endif %}
{%- set has_system = messages[0].role in ('system', 'developer') %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' ~ (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nTo call a function, reply with exactly this format and nothing after it:\n\n' }}
    {{- '<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n' }}
    {{- '<parameter=example_parameter_2>\nA value may span\nseveral lines\n</parameter>\n</function>\n</tool_call>\n\n' }}
    {{- '<IMPORTANT>\nReminder:\n' }}
    {{- '- Each call is one <function=...></function> block inside <tool_call></tool_call> tags\n' }}
    {{- '- Give every required parameter\n' }}
    {{- '- Any reasoning about the call goes BEFORE it, never after\n' }}
    {{- '- When no function fits, answer normally and do not mention the functions\n</IMPORTANT>' }}
    {%- if has_system %}
        {%- set system_text = text_of(messages[0].content) | trim %}
        {%- if system_text %}
            {{- '\n\n' + system_text }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' + (text_of(messages[0].content) | trim) + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = text_of(message.content) | trim %}
    {%- if message.role in ('system', 'developer') %}
        {%- if not loop.first %}
            {{- raise_exception('A system message is only allowed as the first message; merge it into that one.') }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif message.reasoning is string %}
            {%- set reasoning = message.reasoning %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1] | trim %}
        {%- else %}
            {%- set reasoning = '' %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\n<think>\n' + (reasoning | trim) + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not loop.first %}
                    {{- '\n' }}
                {%- elif content %}
                    {{- '\n\n' }}
                {%- endif %}
                {{- '<tool_call>\n<function=' + fn.name + '>\n' }}
                {%- if fn.arguments is mapping %}
                    {%- for name, value in fn.arguments | items %}
                        {{- '<parameter=' + name + '>\n' }}
                        {{- value if value is string else value | tojson }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- elif fn.arguments is defined and fn.arguments is not none and fn.arguments != '' %}
                    {{- raise_exception('tool_calls[].function.arguments must be an object when rendering; '
                                        ~ 'parse the JSON string first.') }}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unknown message role ' ~ message.role ~ '; use system, user, assistant or tool.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
"""
