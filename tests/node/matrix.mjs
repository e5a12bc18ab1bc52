// One client family of the client matrix (tests/clients/test_matrix.py): openai-node against a
// running proxy. Usage: node matrix.mjs <base_url> <model> <user message>
// Prints one JSON object: the sync content and decision, and what the stream delivered.
import OpenAI from "openai";

const [base, model, input] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: "unused", maxRetries: 0 });
const messages = [{ role: "user", content: input }];

const { data: reply, response } = await client.chat.completions.create({ model, messages }).withResponse();
const stream = await client.chat.completions.create({ model, messages, stream: true });
let content = "";
let reasoning = "";
let fingerprint = null;
for await (const chunk of stream) {
  const delta = chunk.choices[0]?.delta ?? {};
  content += delta.content ?? "";
  reasoning += delta.reasoning_content ?? "";
  fingerprint = chunk.system_fingerprint ?? fingerprint;
}
console.log(
  JSON.stringify({
    sync: reply.choices[0].message.content,
    sync_decision: response.headers.get("x-cognitive-decision"),
    sync_fingerprint: reply.system_fingerprint ?? null,
    streamed: content,
    reasoning,
    stream_fingerprint: fingerprint,
  }),
);
