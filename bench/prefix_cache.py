"""Prefix caching: TTFT of requests that share a tenant's ~1,000-token system prompt, with the
engine's prefix cache on against off, side by side in one process.

    .venv/bin/python bench/prefix_cache.py [--model DIR] [--requests 16] [--system-tokens 1000]
        [--max-tokens 32] [--lora-requests 8]

A tenant's assistant instructions plus few-shot examples (about --system-tokens tokens once
the chat template has wrapped them) go first in every request, followed by one short
question; 16 different questions. Requests arrive one at a time, as a stream of users
would: request i+1 is added as soon as request i has its first token, so each new prompt
is prefilled alongside the decodes of the ones before it. TTFT runs from the add to the step
that returns the first token. Both engines (prefix caching on / off, everything else at
the engine's defaults, chunked prefill included) get the same requests, request by request:
they step in turn, one step each, until both have request i's first token (the one done
first waits, its clock stopped), every step timed on its own engine's clock, so load from
elsewhere on this shared machine falls on both alike. Greedy, eos ignored, --max-tokens
each; the outputs of the two engines are compared token for token. The cache's hit rate is
hits / queries (prompt tokens) from `engine.stats()`.

The same is then run for the first --lora-requests requests (0: skip) with every request on
one rank-16 LoRA adapter (bench/common.py), both engines with LoRA enabled: the cache is
per adapter.
Goal: TTFT p50 cached / uncached <= 0.25. The last line is one JSON object of the figures.
"""

import json
import os
import statistics
import time

import torch
from common import bench_parser, make_adapters, model_dir

from inference.engine import EngineConfig, EngineRequest, LLMEngine, LoRARequest, SamplingParams

COMPANY = "Northwind Outfitters"

# A tenant's assistant instructions: sections are added in order until the prompt is long
# enough, then the examples again (numbered on), so any length reads like the real thing.
INSTRUCTIONS = [
    "You are the customer support assistant of {company}, an online shop for outdoor "
    "clothing, camping gear and bicycles that ships to customers across Europe. You answer "
    "questions from customers who write to us through the chat window on our website and "
    "in our mobile app. Your goal is to solve the customer's problem in as few messages as "
    "possible, while being friendly, accurate and honest about what you can and cannot do.",
    "Tone and style. Write in plain, warm language. Address the customer directly and use "
    "short sentences. Do not use marketing phrases, exclamation marks or emojis. Never "
    "blame the customer. If you do not know something, say so and explain how the customer "
    "can find out, or offer to hand the conversation over to a human colleague. Keep every "
    "answer under 120 words unless the customer asks for step-by-step instructions.",
    "Orders and delivery. Standard delivery takes three to five working days within the "
    "European Union and five to eight working days to Switzerland, Norway and the United "
    "Kingdom. Express delivery (next working day for orders placed before 2 pm) is available "
    "in Germany, Austria, the Netherlands and Belgium for 9.90 euros. Orders over 60 euros "
    "ship for free with standard delivery. Every order gets a tracking link by email as "
    "soon as it leaves our warehouse in Leipzig. If a parcel has not moved for five working "
    "days, open a carrier investigation and tell the customer we will send a replacement "
    "or a refund if the parcel is not found within ten days.",
    "Returns and refunds. Customers may return unused items within 60 days of delivery for "
    "a full refund. Returns are free within the European Union; we email a prepaid label "
    "from the returns page of the customer's account. Worn clothing, used sleeping bags and "
    "custom-built bicycles cannot be returned unless they are faulty. Refunds go back to the "
    "original payment method within five working days after the return reaches us. Gift "
    "cards cannot be refunded in cash. Never promise a refund before the item is inspected "
    "when the customer reports damage they caused themselves.",
    "Warranty and repairs. All products carry a two-year legal guarantee. Our own brand, "
    "Northwind Trail, carries a lifetime warranty against manufacturing faults on tents, "
    "backpacks and frames. Ask for the order number, a short description and two photos of "
    "the fault, then create a warranty case. Bicycles need a yearly service at a partner "
    "workshop to keep the frame warranty; the customer can find the nearest workshop on our "
    "website. Do not diagnose mechanical problems with brakes or suspension over chat: "
    "always advise the customer to stop riding and visit a workshop.",
    "Payments and accounts. We accept credit cards, PayPal, Klarna invoice and bank transfer. "
    "Klarna invoices are due after 30 days. You can resend invoices and change the delivery "
    "address until the order is packed. You cannot see or change card numbers, and you must "
    "never ask the customer for a password, a full card number or a security code. To "
    "delete an account, send the customer the link to the privacy page, where they confirm "
    "the request by email.",
    "Escalation. Hand the conversation over to a human colleague when the customer asks "
    "for one, when a refund above 300 euros is requested, when the customer reports an "
    "injury or a safety problem, or when you have failed to solve the problem after three "
    "messages. Tell the customer that a colleague will reply within one working day, and "
    "summarise the case in one line for the colleague.",
    "Format. Start with the answer, then the details. Use a numbered list only for steps. "
    "End with a question only when you need information from the customer. Sign nothing: "
    "the chat window shows your name.",
]
EXAMPLES = [
    (
        "Hi, I ordered a tent last Monday and it still has not arrived. Order 48213.",
        "I am sorry your tent has not arrived yet. Order 48213 left our warehouse on "
        "Wednesday and the tracking shows it at the carrier's depot in Hanover since "
        "Thursday. Standard delivery takes three to five working days, so it should reach "
        "you by Tuesday. If it has not moved by then, I will open an investigation and send "
        "a replacement. Would you like me to set a reminder for Tuesday?",
    ),
    (
        "Can I return a jacket I wore once on a hike? It is too warm.",
        "Thank you for asking before sending it. We can only take back unused items, so a "
        "jacket that has been worn on a hike cannot be returned, unless it is faulty. If "
        "the jacket has a defect, send me two photos and your order number and I will open "
        "a warranty case for you.",
    ),
    (
        "My bike's front brake squeaks and feels weak since yesterday.",
        "Please stop riding the bike until the brake has been checked: a weak front brake "
        "is a safety problem. Our partner workshops can look at it, usually within a few "
        "days; you can find the nearest one on our website under Service. The check is "
        "covered if the bike is less than two years old and has had its yearly service.",
    ),
    (
        "How long does a refund take after you get my return?",
        "Once your return reaches our warehouse, we inspect it within two working days and "
        "the refund goes back to your original payment method within five working days. "
        "You will get an email as soon as it is on its way.",
    ),
    (
        "I want to talk to a real person about my order.",
        "Of course. I have passed your conversation to a colleague, who will reply here "
        "within one working day. You do not need to repeat anything: they will see what we "
        "have discussed.",
    ),
]
QUESTIONS = [
    "Do you ship to Switzerland, and how long does it take?",
    "Can I change the delivery address of order 51870?",
    "My sleeping bag zip broke after two trips. What can I do?",
    "How do I get a return label?",
    "Is express delivery available in Austria?",
    "Can I pay for my order with Klarna?",
    "The tent pole arrived bent. Order 50331.",
    "Where can I get my bike serviced near Munich?",
    "I was charged twice for the same order.",
    "How do I delete my account?",
    "Do gift cards expire?",
    "My parcel has not moved for a week. What now?",
    "Can I return a bike I built with your configurator?",
    "What is the warranty on a Northwind Trail backpack?",
    "Can you resend my invoice for order 49902?",
    "Is delivery free if I order for 75 euros?",
]


def system_prompt(tokenizer, n_tokens: int, company: str = COMPANY) -> str:
    """A tenant's system prompt: instructions, then few-shot examples, added until the
    chat-formatted system message has about `n_tokens` tokens."""
    parts: list[str] = []

    def size() -> int:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": "\n\n".join(parts)}], add_generation_prompt=False
        )
        return len(tokenizer.encode(text, add_special_tokens=False))

    sections = [s.format(company=company) for s in INSTRUCTIONS]
    i = 0
    while size() < n_tokens:
        if i < len(sections):
            parts.append(sections[i])
        else:
            k = i - len(sections)
            customer, assistant = EXAMPLES[k % len(EXAMPLES)]
            parts.append(f"Example {k + 1}.\nCustomer: {customer}\nAssistant: {assistant}")
        i += 1
    words = parts[-1].split(" ")  # cut the last part back to the words that fit
    low, high = 1, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        parts[-1] = " ".join(words[:mid])
        low, high = (mid, high) if size() <= n_tokens else (low, mid - 1)
    ends = [k + 1 for k in range(low) if words[k].endswith((".", "?"))]
    parts[-1] = " ".join(words[: ends[-1] if ends else low])  # at a sentence's end if one fits
    return "\n\n".join(parts)


def chat_ids(tokenizer, system: str, question: str) -> list[int]:
    """Token ids as the server makes them for a chat request (inference/openai/serving_chat.py)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


class Arrivals:
    """One engine's side: requests added one at a time (`add`), stepped on demand, each step
    timed on this side's own clock."""

    def __init__(self, engine: LLMEngine, params, lora: LoRARequest | None):
        self.engine, self.params, self.lora = engine, params, lora
        self.clock = 0.0  # seconds spent in this engine's steps
        self.added: dict[str, float] = {}
        self.ttft: dict[str, float] = {}
        self.tokens: dict[str, list[int]] = {}
        self.steps = 0

    def add(self, prompt: list[int]) -> None:
        rid = str(len(self.added))
        self.added[rid], self.tokens[rid] = self.clock, []
        self.engine.add_request(
            EngineRequest(rid, None, self.params, prompt_token_ids=prompt, lora_request=self.lora)
        )

    def waiting(self) -> bool:
        """Whether the newest request still waits for its first token."""
        return len(self.ttft) < len(self.added)

    def step(self) -> None:
        if not self.engine.has_unfinished():
            return
        start = time.perf_counter()
        outputs = self.engine.step()
        self.clock += time.perf_counter() - start
        self.steps += 1
        for out in outputs:
            self.tokens[out.request_id] += out.new_token_ids
            if out.new_token_ids and out.request_id not in self.ttft:
                self.ttft[out.request_id] = self.clock - self.added[out.request_id]


def compare(engines: dict[str, LLMEngine], prompts, max_tokens: int, lora) -> dict:
    """The arrivals on every engine, request by request: request i goes to each engine once
    its request i-1 has its first token there, and the engines step in turn (one step each)
    until every one has request i's first token; one that has it already waits (its clock
    stops), so each request is measured on both engines at nearly the same time."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    sides = {name: Arrivals(e, params, lora) for name, e in engines.items()}
    for prompt in prompts:
        for side in sides.values():
            side.add(prompt)
        while any(side.waiting() for side in sides.values()):
            for side in sides.values():
                if side.waiting():
                    side.step()
    while any(side.engine.has_unfinished() for side in sides.values()):
        for side in sides.values():
            side.step()
    result = {}
    for name, side in sides.items():
        stats = engines[name].stats()
        ttfts = [side.ttft[str(i)] for i in range(len(prompts))]
        result[name] = {
            "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_first_s": round(ttfts[0], 3),  # the first request finds nothing cached
            "ttft_rest_p50_s": round(statistics.median(ttfts[1:]), 3),
            "seconds": round(side.clock, 2),
            "steps": side.steps,
            "hit_rate": round(
                stats["prefix_cache_hits"] / max(stats["prefix_cache_queries"], 1), 3
            ),
            "tokens": [side.tokens[str(i)] for i in range(len(prompts))],
        }
    on, off = result["cached"], result["uncached"]
    identical = sum(a == b for a, b in zip(on.pop("tokens"), off.pop("tokens"), strict=True))
    return {
        "cached": on,
        "uncached": off,
        "ttft_p50_ratio": round(on["ttft_p50_s"] / off["ttft_p50_s"], 3),
        "identical_outputs": identical,
    }


def make_engines(model, lora: bool, kv_cache_bytes: int) -> dict[str, LLMEngine]:
    def config(caching: bool) -> EngineConfig:
        return EngineConfig(
            model=model,
            device="cpu",
            dtype="float32",
            max_model_len=4096,
            kv_cache_bytes=kv_cache_bytes,
            enable_prefix_caching=caching,
            enable_lora=lora,
            max_loras=1,
            max_lora_rank=16,
        )

    return {"cached": LLMEngine(config(True)), "uncached": LLMEngine(config(False))}


def report(name: str, r: dict) -> None:
    on, off = r["cached"], r["uncached"]
    print(
        f"{name}: TTFT p50 cached {on['ttft_p50_s']} s / uncached {off['ttft_p50_s']} s = "
        f"{r['ttft_p50_ratio']} (first request {on['ttft_first_s']} / {off['ttft_first_s']} s); "
        f"hit rate {on['hit_rate']} / {off['hit_rate']}; engine time {on['seconds']} / "
        f"{off['seconds']} s in {on['steps']} / {off['steps']} steps; "
        f"{r['identical_outputs']} outputs identical",
        flush=True,
    )


def main():
    args = bench_parser(
        __doc__, requests=16, system_tokens=1000, max_tokens=32, lora_requests=8
    ).parse_args()
    base = model_dir(args.model)
    # Room for every request's own blocks with nothing shared, so the uncached engine never
    # preempts: the comparison is of prefill work, not of cache pressure.
    kv_bytes = 1 << 30
    engines = make_engines(base, lora=False, kv_cache_bytes=kv_bytes)
    tok = engines["cached"].tokenizer
    system = system_prompt(tok, args.system_tokens)
    prompts = [chat_ids(tok, system, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.requests)]
    shared = len(os.path.commonprefix(prompts))
    lengths = [len(p) for p in prompts]
    print(
        f"{args.requests} requests, prompts {min(lengths)}..{max(lengths)} tokens, first "
        f"{shared} tokens shared by all, {args.max_tokens} new tokens each, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for e in engines.values():
        e.generate(["Hello there, how are you?"], warm)  # nothing shared with the prompts
    base_result = compare(engines, prompts, args.max_tokens, None)
    report("base model", base_result)
    del engines
    figures = {
        "model": base.name,
        "requests": args.requests,
        "prompt_tokens_min": min(lengths),
        "prompt_tokens_max": max(lengths),
        "max_tokens": args.max_tokens,
        "ttft_p50_cached_s": base_result["cached"]["ttft_p50_s"],
        "ttft_p50_uncached_s": base_result["uncached"]["ttft_p50_s"],
        "ttft_p50_ratio": base_result["ttft_p50_ratio"],
        "hit_rate": base_result["cached"]["hit_rate"],
        "identical_outputs": base_result["identical_outputs"],
        "base": base_result,
    }
    if args.lora_requests:
        [folder] = make_adapters(base, 1)
        lora = LoRARequest("support-bot", "bench-0", str(folder))
        engines = make_engines(base, lora=True, kv_cache_bytes=kv_bytes + (64 << 20))
        for e in engines.values():
            e.generate(["Hello there, how are you?"], warm, lora_request=lora)  # loads it
        lora_result = compare(engines, prompts[: args.lora_requests], args.max_tokens, lora)
        report("one adapter", lora_result)
        figures |= {
            "lora_requests": args.lora_requests,
            "lora_ttft_p50_ratio": lora_result["ttft_p50_ratio"],
            "lora_hit_rate": lora_result["cached"]["hit_rate"],
            "lora_identical_outputs": lora_result["identical_outputs"],
            "lora": lora_result,
        }
    figures["torch_threads"] = torch.get_num_threads()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
