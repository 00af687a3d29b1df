// Renders Ollama Modelfile TEMPLATEs with Go's own text/template, the way Ollama's server calls it
// (template.Execute in ollama/template/template.go): for chat, .System is every system message's
// text joined by a blank line and .Messages the messages (system ones included) with .Role and
// .Content; for generate, .System, .Prompt and .Response. Standard library only.
//
// stdin: a JSON list of {"template": "...", "cases": [{"messages": [{"role": "...", "content": "..."}]} |
//
//	{"system": "...", "prompt": "...", "response": "..."}]}
//
// stdout: a JSON list (one per template) of lists of the rendered strings, one per case.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/template"
)

type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type Case struct {
	Messages []Message `json:"messages"`
	System   string    `json:"system"`
	Prompt   string    `json:"prompt"`
	Response string    `json:"response"`
}

type Request struct {
	Template string `json:"template"`
	Cases    []Case `json:"cases"`
}

func render(tmpl *template.Template, c Case) (string, error) {
	var b bytes.Buffer
	values := map[string]any{"System": c.System, "Prompt": c.Prompt, "Response": c.Response}
	if c.Messages != nil {
		var system []string
		messages := []*Message{}
		for i := range c.Messages {
			if c.Messages[i].Role == "system" {
				system = append(system, c.Messages[i].Content)
			}
			messages = append(messages, &c.Messages[i])
		}
		values = map[string]any{"System": strings.Join(system, "\n\n"), "Messages": messages, "Tools": nil, "Response": ""}
	}
	err := tmpl.Execute(&b, values)
	return b.String(), err
}

// funcs are Ollama's own additions to text/template's functions (ollama/template/template.go).
var funcs = template.FuncMap{
	"json": func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	},
}

func renderAll(req Request) ([]string, error) {
	tmpl, err := template.New("").Funcs(funcs).Parse(req.Template)
	if err != nil {
		return nil, fmt.Errorf("template does not parse: %w", err)
	}
	out := []string{}
	for _, c := range req.Cases {
		s, err := render(tmpl, c)
		if err != nil {
			return nil, fmt.Errorf("template does not execute: %w", err)
		}
		out = append(out, s)
	}
	return out, nil
}

func main() {
	var reqs []Request
	if err := json.NewDecoder(os.Stdin).Decode(&reqs); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		os.Exit(2)
	}
	all := [][]string{}
	for i, req := range reqs {
		out, err := renderAll(req)
		if err != nil {
			fmt.Fprintf(os.Stderr, "template %d: %v\n", i, err)
			os.Exit(1)
		}
		all = append(all, out)
	}
	json.NewEncoder(os.Stdout).Encode(all)
}
