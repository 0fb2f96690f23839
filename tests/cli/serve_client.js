// serve_client.js - `serve` driven by the client OpenAI's users have: the npm package `openai` (pinned by
// scripts/fetch-openai-npm.sh; NODE_PATH points at it). Run by tests/cli/serve.sh:
//   node serve_client.js BASE_URL WANT.json
// WANT.json: {"model": ..., "tokens": N, "texts": {prompt: generate's greedy continuation of N tokens}}.
// Prints "ok: ..." / "FAIL: ..." lines (serve.sh counts them) and exits 1 on any failure.
'use strict';
const fs = require('fs');
const OpenAI = require('openai');

const [base, wantFile] = process.argv.slice(2);
const want = JSON.parse(fs.readFileSync(wantFile, 'utf8'));
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const prompts = Object.keys(want.texts);
let failed = 0;
const check = (cond, what, detail) => {
    console.log(`${cond ? 'ok' : 'FAIL'}: openai npm: ${what}${cond || detail === undefined ? '' : ': ' + detail}`);
    if (!cond) failed++;
};
const greedy = { model: want.model, max_tokens: want.tokens, temperature: 0 };

async function streamText(stream) {
    let text = '', chunks = 0, finish = null, usage = null;
    for await (const c of stream) {
        chunks++;
        if (c.usage) usage = c.usage;
        for (const ch of c.choices) {
            text += (ch.delta ? ch.delta.content : ch.text) || '';
            if (ch.finish_reason) finish = ch.finish_reason;
        }
    }
    return { text, chunks, finish, usage };
}

async function main() {
    const models = await client.models.list();
    check(models.data.length === 1 && models.data[0].id === want.model, 'models.list names the model',
          JSON.stringify(models.data));

    const p0 = prompts[0];
    const c = await client.completions.create({ ...greedy, prompt: p0 });
    check(c.choices[0].text === want.texts[p0], 'completions.create (greedy) equals generate', JSON.stringify(c.choices[0].text));
    check(c.usage.completion_tokens === want.tokens && c.usage.total_tokens === c.usage.prompt_tokens + want.tokens &&
          c.choices[0].finish_reason === 'length', 'completions.create usage and finish_reason', JSON.stringify(c.usage));

    const s = await streamText(await client.chat.completions.create({
        ...greedy, messages: [{ role: 'user', content: p0 }], stream: true, stream_options: { include_usage: true } }));
    check(s.text === want.texts[p0], 'chat.completions.create (stream, plain template) equals generate', JSON.stringify(s.text));
    check(s.chunks >= want.tokens && s.finish === 'length' && s.usage && s.usage.completion_tokens === want.tokens,
          'the stream came in pieces, with its finish_reason and usage', JSON.stringify(s));

    const chat = await client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: p0 }] });
    check(chat.choices[0].message.role === 'assistant' && chat.choices[0].message.content === want.texts[p0],
          'chat.completions.create (whole) equals generate', JSON.stringify(chat.choices[0].message));

    // several streams at once, each its own inference session: each text is the single-request greedy text
    const all = await Promise.all(prompts.map(async (p) => streamText(await client.completions.create({
        ...greedy, prompt: p, stream: true }))));
    prompts.forEach((p, i) => check(all[i].text === want.texts[p], `concurrent stream ${i} equals generate`,
                                    JSON.stringify(all[i].text)));

    // a stop string: cut before it, streamed or not, and never sent
    const full = want.texts[p0], cut = full.indexOf(' ', 8) > 0 ? full.slice(full.indexOf(' ', 8), full.indexOf(' ', 8) + 4) : null;
    if (cut) {
        const w = await client.completions.create({ ...greedy, prompt: p0, stop: [cut, 'zzzz'] });
        const st = await streamText(await client.completions.create({ ...greedy, prompt: p0, stop: cut, stream: true }));
        const expect = full.slice(0, full.indexOf(cut));
        check(w.choices[0].text === expect && w.choices[0].finish_reason === 'stop', `stop ${JSON.stringify(cut)} (whole)`,
              JSON.stringify(w.choices[0]));
        check(st.text === expect && st.finish === 'stop', `stop ${JSON.stringify(cut)} (stream)`, JSON.stringify(st));
    }

    // n samples with a seed: n choices, the same again with the same seed
    const samp = { model: want.model, prompt: p0, max_tokens: 12, temperature: 1, n: 3, seed: 7 };
    const a = await client.completions.create(samp), b = await client.completions.create(samp);
    check(a.choices.length === 3 && a.choices.map((x) => x.index).join() === '0,1,2', 'n=3 gives 3 choices');
    check(JSON.stringify(a.choices) === JSON.stringify(b.choices), 'the same seed gives the same samples');

    // errors: the client's own error classes, from OpenAI's status codes and shapes
    const err = async (what, status, fn, param) => {
        try {
            await fn();
            check(false, what, 'no error');
        } catch (e) {
            check(e.status === status && (!param || e.param === param) && typeof e.message === 'string',
                  `${what}: ${status}`, `${e.status} ${e.param} ${e.message}`);
        }
    };
    await err('an unknown model', 404, () => client.completions.create({ ...greedy, model: 'nope', prompt: 'x' }), 'model');
    await err('temperature 3', 400, () => client.completions.create({ ...greedy, temperature: 3, prompt: 'x' }), 'temperature');
    await err('no messages', 400, () => client.chat.completions.create({ ...greedy, messages: [] }), 'messages');
    await err('a stream with n too large', 400, () => client.completions.create({ ...greedy, prompt: 'x', n: 99, stream: true }), 'n');
}

main().then(() => process.exit(failed ? 1 : 0), (e) => {
    console.log(`FAIL: openai npm: ${e.stack || e}`);
    process.exit(1);
});
